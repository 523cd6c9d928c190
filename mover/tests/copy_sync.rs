//! `--sync` fsyncs files and directories; the copy must still be complete and identical, on the
//! anonymous-staging path and on replacing existing files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use copy_support::*;

#[test]
fn sync_copy_is_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    for i in 0..20usize {
        write(
            &src.join(format!("d{}/f{i}", i % 4)),
            &vec![i as u8; i * 5000],
        );
    }
    let first = copy_ok(&src, &dst, &["--sync"]);
    assert_eq!(first.n("files"), 20);
    write(&src.join("d0/f0"), b"replaced");
    let second = copy_ok(&src, &dst, &["--sync"]);
    assert_eq!(second.n("files"), 1);
    assert_same_tree(&src, &dst);
    assert!(temp_names(&dst).is_empty());
}
