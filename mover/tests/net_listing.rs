//! `-v`/`-i` over the network: the receiver itemizes what it changes in its destination (with
//! the same codes as `copy -i`, deletions included); the sender lists the files whose data it
//! sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

fn set_mtime(path: &Path, sec: u64) {
    let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(sec);
    std::fs::File::open(path).unwrap().set_modified(t).unwrap();
}

#[test]
fn the_receiver_itemizes_its_changes_and_the_sender_lists_what_it_sent() {
    let pki = pki("net-listing");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    write(&src.join("new.txt"), b"new");
    write(&src.join("same.txt"), b"same");
    write(&src.join("grown.txt"), b"longer than before");
    write(&src.join("d/inner"), b"inner");
    std::os::unix::fs::symlink("new.txt", src.join("link")).unwrap();
    write(&dst.join("same.txt"), b"same");
    write(&dst.join("grown.txt"), b"short");
    write(&dst.join("extra"), b"extra");
    write(&dst.join("gone/deep"), b"x");
    set_mtime(&src.join("same.txt"), 1_600_000_000);
    set_mtime(&dst.join("same.txt"), 1_600_000_000);
    set_mtime(&src.join("grown.txt"), 1_700_000_000);
    set_mtime(&dst.join("grown.txt"), 1_600_000_000);

    let mut recv = Command::new(BIN)
        .args([
            "receive",
            "-i",
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--json",
            "--root",
        ])
        .arg(&dst)
        .args(pki.args("receiver"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, out) = bound_addr(&mut recv);
    let send = Command::new(BIN)
        .args(["send", "-v", "--delete", "--connect", &addr, "--root"])
        .arg(&src)
        .args(pki.args("sender"))
        .output()
        .unwrap();
    let lines: Vec<String> = out.lines().map(Result::unwrap).collect();
    assert!(recv.wait().unwrap().success());
    assert!(send.status.success(), "{send:?}");
    let mut itemized: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .filter(|l| !l.starts_with('{'))
        .collect();
    itemized.sort_unstable();
    assert_eq!(
        itemized,
        [
            "*deleting   extra",
            "*deleting   gone/",
            ">f+++++++++ d/inner",
            ">f+++++++++ new.txt",
            ">f.st...... grown.txt",
            "cL+++++++++ link -> new.txt",
            "cd+++++++++ d/",
        ]
    );
    let mut sent: Vec<String> = String::from_utf8(send.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    sent.sort_unstable();
    assert_eq!(sent, ["d/inner", "grown.txt", "new.txt"]);
}
