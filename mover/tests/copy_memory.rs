//! Memory does not grow with the number of files: peak RSS for 20 000 files stays under 64 MiB
//! and close to the peak for 2 000.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use std::process::Command;

use copy_support::*;

/// Peak RSS in KiB of `ferry-mover copy src dst`, from `/usr/bin/time -v`.
fn peak_rss_kib(src: &std::path::Path, dst: &std::path::Path) -> u64 {
    let out = Command::new("/usr/bin/time")
        .arg("-v")
        .arg(BIN)
        .args(["copy", "--json"])
        .arg(src)
        .arg(dst)
        .output()
        .expect("/usr/bin/time (apt package `time`, see tests/scripts/deps.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no RSS in: {stderr}"))
}

fn make_tree(root: &std::path::Path, files: usize) {
    for d in 0..20 {
        std::fs::create_dir_all(root.join(format!("d{d}"))).unwrap();
    }
    for i in 0..files {
        std::fs::write(root.join(format!("d{}/f{i}", i % 20)), b"0123456789abcdef").unwrap();
    }
}

#[test]
fn peak_rss_is_bounded_and_independent_of_file_count() {
    let tmp = tempfile::tempdir().unwrap();
    let small = tmp.path().join("small");
    let large = tmp.path().join("large");
    make_tree(&small, 2_000);
    make_tree(&large, 20_000);
    let rss_small = peak_rss_kib(&small, &tmp.path().join("out-small"));
    let rss_large = peak_rss_kib(&large, &tmp.path().join("out-large"));
    eprintln!("peak RSS: 2 000 files {rss_small} KiB, 20 000 files {rss_large} KiB");
    assert!(rss_large < 64 * 1024, "20 000 files used {rss_large} KiB");
    assert!(
        rss_large <= rss_small + rss_small / 4 + 2048,
        "RSS grows with file count: {rss_small} KiB -> {rss_large} KiB"
    );
}
