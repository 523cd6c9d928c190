//! A symlink planted inside DST that points outside never lets the copy write outside.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use copy_support::*;

#[test]
fn hostile_symlinks_in_destination_are_replaced_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    let outside = tmp.path().join("outside");
    write(&outside.join("victim"), b"original");
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    write(&src.join("dir/file"), b"payload");
    write(&src.join("victim"), b"payload");
    write(&src.join("sub/x"), b"payload");
    std::fs::create_dir_all(&dst).unwrap();
    // dst/dir -> outside (a directory link), dst/victim -> outside/victim (a file link),
    // dst/sub -> outside/sub.
    std::os::unix::fs::symlink(&outside, dst.join("dir")).unwrap();
    std::os::unix::fs::symlink(outside.join("victim"), dst.join("victim")).unwrap();
    std::os::unix::fs::symlink(outside.join("sub"), dst.join("sub")).unwrap();
    let before = walk(&outside)
        .into_iter()
        .map(|(p, m)| (p, m.len()))
        .collect::<Vec<_>>();

    copy_ok(&src, &dst, &["--delete"]);
    let after = walk(&outside)
        .into_iter()
        .map(|(p, m)| (p, m.len()))
        .collect::<Vec<_>>();
    assert_eq!(
        before, after,
        "something was written outside the destination"
    );
    assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"original");
    assert!(!outside.join("file").exists() && !outside.join("sub/x").exists());
    assert_same_tree(&src, &dst);
}
