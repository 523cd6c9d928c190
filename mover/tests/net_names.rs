//! Names that are not UTF-8 travel as bytes: files, directories, symlink targets, hard links and
//! `--delete` listings arrive byte for byte, as local `copy` keeps them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use common::*;

fn p(root: &Path, rel: &[u8]) -> PathBuf {
    root.join(OsStr::from_bytes(rel))
}

fn latin1_tree(root: &Path) {
    write(&p(root, b"caf\xe9.txt"), b"latin-1 name\n");
    write(
        &p(root, b"d\xff/inner \xfe.bin"),
        &random_bytes(2 * 1024 * 1024 + 3, 7),
    );
    write(&p(root, b"d\xff/ok.txt"), b"plain\n");
    std::fs::create_dir_all(p(root, b"empty \x80")).unwrap();
    std::os::unix::fs::symlink(OsStr::from_bytes(b"caf\xe9.txt"), p(root, b"link")).unwrap();
    std::os::unix::fs::symlink(
        OsStr::from_bytes(b"../nowhere/\xc3\x28"),
        p(root, b"d\xff/l\xe9"),
    )
    .unwrap();
    std::fs::hard_link(p(root, b"caf\xe9.txt"), p(root, b"hard \xe9")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_names_and_link_targets_arrive_byte_identical() {
    let pki = pki("names-1");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    latin1_tree(src.path());
    let (sent, recv) = round_trip(&pki, src.path(), dst.path(), &SendOpts::default()).await;
    assert_same_tree(src.path(), dst.path());
    assert_eq!(sent.files, recv.files);
    assert_eq!(
        std::fs::read_link(p(dst.path(), b"d\xff/l\xe9"))
            .unwrap()
            .as_os_str()
            .as_bytes(),
        b"../nowhere/\xc3\x28"
    );
    use std::os::unix::fs::MetadataExt;
    let ino = |rel: &[u8]| std::fs::metadata(p(dst.path(), rel)).unwrap().ino();
    assert_eq!(ino(b"caf\xe9.txt"), ino(b"hard \xe9"), "hard link kept");

    // --delete compares names as bytes: a non-UTF-8 extra goes, the source's names stay.
    write(&p(dst.path(), b"d\xff/extra \xe9"), b"not in source");
    let o = SendOpts {
        delete: true,
        ..Default::default()
    };
    let (_, recv) = round_trip(&pki, src.path(), dst.path(), &o).await;
    assert_eq!(recv.files, 0, "nothing rewritten");
    assert!(!p(dst.path(), b"d\xff/extra \xe9").exists());
    assert_same_tree(src.path(), dst.path());
}

#[test]
fn non_utf8_names_through_the_binaries() {
    let pki = pki("names-2");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    latin1_tree(src.path());
    let mut recv = std::process::Command::new(BIN)
        .args(["receive", "--listen", "127.0.0.1:0", "--once", "--root"])
        .arg(dst.path())
        .args(pki.args("receiver"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, _out) = bound_addr(&mut recv);
    let status = std::process::Command::new(BIN)
        .args(["send", "--connect", &addr, "--root"])
        .arg(src.path())
        .args(pki.args("sender"))
        .status()
        .unwrap();
    assert!(status.success(), "send failed: {status}");
    assert!(recv.wait().unwrap().success());
    assert_same_tree(src.path(), dst.path());
}
