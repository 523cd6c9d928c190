//! Symlinks are copied as links (never followed); hard links inside the tree stay hard links.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use std::os::unix::fs::MetadataExt;

use copy_support::*;

#[test]
fn symlinks_are_copied_as_links_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    let outside = tmp.path().join("outside");
    write(&outside.join("big-secret"), b"must not be copied");
    write(&src.join("real"), b"data");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::os::unix::fs::symlink("../real", src.join("d/rel")).unwrap();
    std::os::unix::fs::symlink(&outside, src.join("to-outside-dir")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", src.join("dangling")).unwrap();
    set_mtime(&src.join("dangling"), 1_234_567_890, 42);

    let run = copy_ok(&src, &dst, &[]);
    assert_eq!(run.n("symlinks"), 3);
    assert_same_tree(&src, &dst);
    assert!(
        std::fs::symlink_metadata(dst.join("to-outside-dir"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_link(dst.join("to-outside-dir")).unwrap(),
        outside
    );
    assert!(
        !dst.join("to-outside-dir")
            .join("big-secret")
            .symlink_metadata()
            .is_ok_and(|m| m.is_file()
                && m.ino() != std::fs::metadata(outside.join("big-secret")).unwrap().ino())
    );
    let md = std::fs::symlink_metadata(dst.join("dangling")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_234_567_890, 42));
    // Only the link was made: nothing from the outside directory was copied into dst.
    assert_eq!(walk(&dst).len(), walk(&src).len());
}

#[test]
fn hard_links_inside_the_tree_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    write(&src.join("a/first"), b"shared contents");
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::hard_link(src.join("a/first"), src.join("b/second")).unwrap();
    std::fs::hard_link(src.join("a/first"), src.join("third")).unwrap();
    write(&src.join("alone"), b"single");

    let run = copy_ok(&src, &dst, &[]);
    assert_eq!(run.n("hardlinks"), 2);
    assert_eq!(
        run.n("files"),
        2,
        "one data copy for the linked inode, one for alone"
    );
    assert_same_tree(&src, &dst);
    let ino = |p: &str| std::fs::metadata(dst.join(p)).unwrap().ino();
    assert_eq!(ino("a/first"), ino("b/second"));
    assert_eq!(ino("a/first"), ino("third"));
    assert_ne!(ino("a/first"), ino("alone"));
    assert_eq!(std::fs::metadata(dst.join("third")).unwrap().nlink(), 3);

    // A second run keeps them linked and copies nothing.
    let again = copy_ok(&src, &dst, &[]);
    assert_eq!((again.n("files"), again.n("hardlinks")), (0, 0));
    assert_eq!(ino("a/first"), ino("b/second"));
}
