//! Feeds arbitrary bytes to the parser of every path a peer names (`PeerPath::parse`). Must never
//! panic; what it accepts is relative, has no empty, `.` or `..` component and no NUL, never
//! names the staging directory, and parses back to itself.
#![no_main]

use ferry_mover::tree::peer_path::PeerPath;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(p) = PeerPath::parse(data) else {
        return;
    };
    let b = p.as_bytes();
    assert!(!b.is_empty() && b[0] != b'/' && !b.contains(&0));
    for c in b.split(|&c| c == b'/') {
        assert!(!c.is_empty() && c != b"." && c != b"..", "{:?}", String::from_utf8_lossy(b));
    }
    assert_ne!(b.split(|&c| c == b'/').next(), Some(b".ferry-staging".as_slice()));
    assert_eq!(PeerPath::parse(b).ok().as_ref(), Some(&p));
    let (parent, leaf) = p.split_parent();
    assert!(!leaf.is_empty() && !leaf.contains(&b'/'));
    if let Some(parent) = parent {
        assert_eq!(parent.len() + 1 + leaf.len(), b.len());
    }
});
