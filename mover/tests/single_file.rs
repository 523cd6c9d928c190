//! A single file as the source of `copy` and of `send`: it lands in the destination directory
//! under its own name; its siblings in the source are not part of the transfer and the
//! destination's other entries stay, even with `--delete`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::Command;

use common::*;

fn setup(base: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let src = base.join("src");
    write(&src.join("model.bin"), &random_bytes(6 << 20, 7));
    write(&src.join("sibling"), b"not part of it");
    let dst = base.join("dst");
    write(&dst.join("other"), b"stays");
    (src, dst)
}

fn check(src: &Path, dst: &Path, parent_mtime: i64) {
    assert_eq!(
        std::fs::read(dst.join("model.bin")).unwrap(),
        std::fs::read(src.join("model.bin")).unwrap()
    );
    let (s, d) = (
        std::fs::metadata(src.join("model.bin")).unwrap(),
        std::fs::metadata(dst.join("model.bin")).unwrap(),
    );
    assert_eq!((s.mtime(), s.mode()), (d.mtime(), d.mode()));
    assert!(!dst.join("sibling").exists(), "a sibling was copied");
    assert_eq!(std::fs::read(dst.join("other")).unwrap(), b"stays");
    assert_ne!(
        std::fs::metadata(dst).unwrap().mtime(),
        parent_mtime,
        "the destination took the metadata of the file's parent"
    );
}

fn old_mtime(dir: &Path) -> i64 {
    let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_500_000_000);
    std::fs::File::open(dir).unwrap().set_modified(t).unwrap();
    1_500_000_000
}

#[test]
fn copy_of_a_single_file_lands_under_its_name_and_delete_spares_the_rest() {
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = setup(base.path());
    let mtime = old_mtime(&src);
    let out = Command::new(BIN)
        .args(["copy", "--delete", "--json"])
        .arg(src.join("model.bin"))
        .arg(&dst)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (summary["files"].as_u64(), summary["deleted"].as_u64()),
        (Some(1), Some(0))
    );
    check(&src, &dst, mtime);
    // Into a directory that does not exist yet.
    let fresh = base.path().join("fresh/deeper");
    let out = Command::new(BIN)
        .arg("copy")
        .arg(src.join("model.bin"))
        .arg(&fresh)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read(fresh.join("model.bin")).unwrap(),
        std::fs::read(src.join("model.bin")).unwrap()
    );
}

#[test]
fn send_of_a_single_file_lands_under_its_name_and_delete_spares_the_rest() {
    let pki = pki("single-file");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = setup(base.path());
    let mtime = old_mtime(&src);
    let (mut recv, addr, _out) = spawn_receiver(&pki, &dst, &[]);
    let send = run_sender(&pki, &src.join("model.bin"), &addr, &["--json", "--delete"]);
    let status = recv.wait().unwrap();
    assert!(send.status.success(), "{send:?}");
    assert!(status.success());
    let summary: serde_json::Value = serde_json::from_slice(&send.stdout).unwrap();
    assert_eq!(summary["files"].as_u64(), Some(1), "{summary}");
    check(&src, &dst, mtime);
}
