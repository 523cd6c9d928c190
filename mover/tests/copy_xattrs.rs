//! `--xattrs` copies user.* extended attributes; without it they are not copied.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use copy_support::*;

fn get(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 1024];
    rustix::fs::lgetxattr(path, name, &mut buf[..])
        .ok()
        .map(|n| buf[..n].to_vec())
}

#[test]
fn user_xattrs_only_with_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write(&src.join("d/f"), b"data");
    rustix::fs::lsetxattr(
        src.join("d/f"),
        "user.color",
        b"blue",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    rustix::fs::lsetxattr(
        src.join("d"),
        "user.kind",
        b"dir",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();

    let plain = tmp.path().join("plain");
    copy_ok(&src, &plain, &[]);
    assert_eq!(get(&plain.join("d/f"), "user.color"), None);

    let with = tmp.path().join("with");
    copy_ok(&src, &with, &["--xattrs"]);
    assert_eq!(
        get(&with.join("d/f"), "user.color").as_deref(),
        Some(&b"blue"[..])
    );
    assert_eq!(
        get(&with.join("d"), "user.kind").as_deref(),
        Some(&b"dir"[..])
    );
}
