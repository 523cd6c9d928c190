//! The library entry point with the fallbacks forced: per-component directory walk instead of
//! openat2, read/write instead of copy_file_range, and a single worker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use ferry_mover::copy::{CopyOptions, copy_tree};
use ferry_mover::report::Progress;
use ferry_mover::tree::Resolve;
use std::sync::Arc;

use copy_support::*;

#[test]
fn fallback_paths_produce_the_same_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    for i in 0..40usize {
        let data: Vec<u8> = (0..i * 7919).map(|j| (j % 251) as u8).collect();
        write(&src.join(format!("a/b{}/f{i}", i % 4)), &data);
    }
    write(&src.join("big"), &vec![7u8; 3 << 20]);
    std::os::unix::fs::symlink("a/b1", src.join("link")).unwrap();
    let opts = CopyOptions {
        jobs: 1,
        resolve: Resolve::Walk,
        no_copy_file_range: true,
        ..CopyOptions::default()
    };
    let progress = Arc::new(Progress::new("local", "copy"));
    let summary = copy_tree(&src, &dst, &opts, progress.clone()).unwrap();
    assert_eq!(
        (summary.files, summary.failed, summary.symlinks),
        (41, 0, 1)
    );
    assert_eq!(progress.snapshot().files_done, 41);
    assert_same_tree(&src, &dst);
}
