//! `-v`/`-i` over the network: the receiver itemizes what it changes in its destination (with
//! the same codes as `copy -i`, deletions included); the sender lists the files whose data it
//! sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};

use common::*;

fn set_mtime(path: &Path, sec: u64) {
    let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(sec);
    std::fs::File::open(path).unwrap().set_modified(t).unwrap();
}

const EXPECTED: [&str; 7] = [
    "*deleting   extra",
    "*deleting   gone/",
    ">f+++++++++ d/inner",
    ">f+++++++++ new.txt",
    ">f.st...... grown.txt",
    "cL+++++++++ link -> new.txt",
    "cd+++++++++ d/",
];

fn setup(base: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (src, dst) = (base.join("src"), base.join("dst"));
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
    (src, dst)
}

/// One session: the receiver's itemized lines (sorted), its JSON summary, and the sender's
/// output.
fn session(
    pki: &Pki,
    src: &Path,
    dst: &Path,
    send_flags: &[&str],
) -> (Vec<String>, serde_json::Value, std::process::Output) {
    let (mut recv, addr, out) = spawn_receiver(pki, dst, &["-i", "--json"]);
    let flags = [&["--delete"][..], send_flags].concat();
    let send = run_sender(pki, src, &addr, &flags);
    let lines: Vec<String> = out.lines().map(Result::unwrap).collect();
    assert!(recv.wait().unwrap().success());
    assert!(send.status.success(), "{send:?}");
    let mut itemized: Vec<String> = lines
        .iter()
        .filter(|l| !l.starts_with('{'))
        .cloned()
        .collect();
    itemized.sort_unstable();
    let json = lines
        .iter()
        .find(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .unwrap_or_default();
    (itemized, json, send)
}

#[test]
fn the_receiver_itemizes_its_changes_and_the_sender_lists_what_it_sent() {
    let pki = pki("net-listing");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = setup(base.path());
    let (itemized, _, send) = session(&pki, &src, &dst, &["-v"]);
    assert_eq!(itemized, EXPECTED);
    let mut sent: Vec<String> = String::from_utf8(send.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    sent.sort_unstable();
    assert_eq!(sent, ["d/inner", "grown.txt", "new.txt"]);
}

/// Everything of a directory tree but its atime: what a dry run must not change.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    describe(root)
}

#[test]
fn a_dry_run_over_the_network_changes_nothing_and_lists_what_the_real_run_does() {
    let pki = pki("net-dry-run");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = setup(base.path());
    let dst_mtime = std::fs::metadata(&dst).unwrap().modified().unwrap();
    let before = snapshot(&dst);
    let (planned, json, send) = session(&pki, &src, &dst, &["-n", "--json"]);
    assert!(send.status.success(), "{send:?}");
    assert_eq!(planned, EXPECTED);
    assert_eq!(
        snapshot(&dst),
        before,
        "the dry run changed the destination"
    );
    assert_eq!(
        std::fs::metadata(&dst).unwrap().modified().unwrap(),
        dst_mtime
    );
    assert!(!dst.join(".ferry-staging").exists());
    assert_eq!(json["dry_run"], true, "{json}");
    assert_eq!(
        (json["files"].as_u64(), json["deleted"].as_u64()),
        (Some(3), Some(2))
    );
    let sent: serde_json::Value = serde_json::from_slice(&send.stdout).unwrap();
    assert_eq!(sent["dry_run"], true, "{sent}");
    assert_eq!(
        (sent["files"].as_u64(), sent["skipped"].as_u64()),
        (Some(3), Some(1))
    );
    // The real run does what the dry run listed.
    let (done, json, send) = session(&pki, &src, &dst, &[]);
    assert!(send.status.success(), "{send:?}");
    assert_eq!(done, planned);
    assert!(json.get("dry_run").is_none(), "{json}");
    assert_same_tree(&src, &dst);
}

#[test]
fn a_dry_run_into_a_missing_root_plans_everything_as_new_and_creates_nothing() {
    let pki = pki("net-dry-missing");
    let base = tempfile::tempdir().unwrap();
    let (src, _) = setup(base.path());
    let missing = base.path().join("not-yet");
    let (planned, json, send) = session(&pki, &src, &missing, &["-n"]);
    assert!(send.status.success(), "{send:?}");
    assert!(!missing.exists(), "the dry run created the root");
    assert_eq!(json["files"].as_u64(), Some(4), "{json}");
    assert!(
        planned.contains(&">f+++++++++ same.txt".to_owned()),
        "{planned:?}"
    );
}
