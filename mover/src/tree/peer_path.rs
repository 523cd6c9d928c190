//! Paths received from a peer: the engine's [`RelPath`] rules (plain components below the root;
//! the receiver, not the sender, decides where bytes land), as raw bytes the way Unix names are
//! (not necessarily UTF-8), and never the receiver's own staging directory.

use crate::tree::RelPath;

/// Top-level name the receiver keeps for its own resume state; peers may not touch it.
pub const STAGING_DIR: &str = ".ferry-staging";

#[derive(Debug, thiserror::Error)]
#[error("invalid path {shown:?} from peer: {why}")]
pub struct PeerPathError {
    shown: String,
    why: String,
}

/// A validated peer path: a valid [`RelPath`] (non-empty, at most 4095 bytes, components of at
/// most 255 bytes, no '.', '..', empty component, NUL or leading '/') that is not inside the
/// receiver's staging directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerPath(RelPath);

impl PeerPath {
    pub fn parse(bytes: &[u8]) -> Result<Self, PeerPathError> {
        let err = |why: String| PeerPathError {
            shown: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
            why,
        };
        let rel = RelPath::parse(bytes).map_err(|e| err(e.to_string()))?;
        if rel.components().next() == Some(STAGING_DIR.as_bytes()) {
            return Err(err("names the receiver's staging directory".into()));
        }
        Ok(Self(rel))
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    pub fn rel(&self) -> &RelPath {
        &self.0
    }

    /// (parent directory components, leaf name)
    pub fn split_parent(&self) -> (Option<&[u8]>, &[u8]) {
        let b = self.0.as_bytes();
        match b.iter().rposition(|&c| c == b'/') {
            Some(cut) => (Some(&b[..cut]), &b[cut + 1..]),
            None => (None, b),
        }
    }
}

impl std::fmt::Display for PeerPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "..",
            "a/../../x",
            "a/./b",
            "a//b",
            "a/",
            "./a",
            "a\0b",
            ".ferry-staging/x",
            ".ferry-staging",
        ] {
            assert!(PeerPath::parse(bad.as_bytes()).is_err(), "{bad:?} accepted");
        }
        for bad in [
            &b"\xff/../x"[..],
            b"/\xe9",
            b"caf\xe9\0",
            b"\xe9//a",
            b".ferry-staging/\xe9",
        ] {
            assert!(PeerPath::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(PeerPath::parse("x".repeat(300).as_bytes()).is_err());
        assert!(PeerPath::parse("a/".repeat(3000).as_bytes()).is_err());
    }

    #[test]
    fn plain_names_are_accepted() {
        for good in [
            "a",
            "a/b/c",
            "with space/ü",
            "x/.ferry-staging",
            "..a",
            "a..",
        ] {
            assert_eq!(
                PeerPath::parse(good.as_bytes()).unwrap().as_bytes(),
                good.as_bytes()
            );
        }
        let p = PeerPath::parse(b"a/b/c").unwrap();
        assert_eq!(p.split_parent(), (Some(&b"a/b"[..]), &b"c"[..]));
        let odd = PeerPath::parse(b"d\xff/caf\xe9.txt").unwrap();
        assert_eq!(
            odd.split_parent(),
            (Some(&b"d\xff"[..]), &b"caf\xe9.txt"[..])
        );
        assert_eq!(odd.to_string(), "d\\xff/caf\\xe9.txt");
    }
}
