//! `copy --bandwidth-limit`: the same quantity syntax as send and a Transfer, shared by all
//! workers, `0` for none. Only lower bounds on time are asserted: a loaded machine can only make
//! a paced copy slower, never faster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// 3 MB in one file (copy_file_range path) and 64 small files of 16 KiB (one read, one write).
fn dataset() -> tempfile::TempDir {
    let src = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.path().join("big.bin"), &big).unwrap();
    for i in 0..64 {
        std::fs::write(
            src.path().join(format!("small-{i}")),
            vec![i as u8; 16 * 1024],
        )
        .unwrap();
    }
    src
}

fn copy(
    src: &std::path::Path,
    dst: &std::path::Path,
    limit: &str,
) -> (std::process::Output, Duration) {
    let start = Instant::now();
    let out = Command::new(BIN)
        .args(["copy", "--json", "--bandwidth-limit", limit])
        .arg(src)
        .arg(dst)
        .output()
        .unwrap();
    (out, start.elapsed())
}

#[test]
fn a_limited_copy_takes_at_least_its_bytes_over_the_rate() {
    let src = dataset();
    let dst = tempfile::tempdir().unwrap();
    // 4 049 152 bytes at 4 MB/s, minus the bucket's 256 KiB burst: at least 0.94 s.
    let (out, took) = copy(src.path(), &dst.path().join("d"), "4M");
    assert!(out.status.success(), "{out:?}");
    assert!(
        took >= Duration::from_millis(900),
        "4 MB at 4M/s took only {took:?}"
    );
    assert_same_tree(src.path(), &dst.path().join("d"));
}

#[test]
fn zero_means_no_limit_and_nonsense_is_refused() {
    let src = dataset();
    let dst = tempfile::tempdir().unwrap();
    let (out, _) = copy(src.path(), &dst.path().join("d"), "0");
    assert!(out.status.success(), "{out:?}");
    assert_same_tree(src.path(), &dst.path().join("d"));
    let (bad, _) = copy(src.path(), &dst.path().join("e"), "fast");
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--bandwidth-limit"), "{err}");
    assert!(
        !dst.path().join("e").exists(),
        "a refused command wrote nothing"
    );
}
