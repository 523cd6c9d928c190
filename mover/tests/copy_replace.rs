//! What `ferry-mover copy` does when the destination has another kind of entry at a name: a
//! non-empty directory is never replaced by a non-directory without `--delete` (the entry fails,
//! the rest is copied, exit status 1); with `--delete` it is, counted in `deleted`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;
mod replace_matrix;

use copy_support::*;

/// The report's reproduction: `ts/f` is a file, `td/f` a directory holding `inner`.
#[test]
fn a_file_never_silently_replaces_a_non_empty_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let (ts, td) = (tmp.path().join("ts"), tmp.path().join("td"));
    write(&ts.join("f"), b"x\n");
    write(&td.join("f/inner"), b"z\n");
    let out = std::process::Command::new(BIN)
        .arg("copy")
        .arg(&ts)
        .arg(&td)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(std::fs::read(td.join("f/inner")).unwrap(), b"z\n");
    assert!(
        stderr.contains(&format!(
            "refusing to replace non-empty directory {} with a file",
            td.join("f").display()
        )) && stderr.contains("--delete"),
        "{stderr}"
    );
    assert!(stderr.contains("deleted 0; failed 1"), "{stderr}");

    let run = copy(&ts, &td, &["--delete"]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!((run.n("deleted"), run.n("failed")), (1, 0));
    assert_eq!(std::fs::read(td.join("f")).unwrap(), b"x\n");
}

#[test]
fn every_kind_over_every_kind_without_delete() {
    let w = replace_matrix::world();
    let run = copy(&w.src, &w.dst, &[]);
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert_eq!(run.n("failed"), replace_matrix::expected_failed(false));
    assert_eq!(run.n("deleted"), 0);
    assert_eq!(run.n("specials_skipped"), 5);
    w.check(false, &run.stderr);
    assert!(temp_names(&w.dst).is_empty(), "{:?}", temp_names(&w.dst));
}

#[test]
fn every_kind_over_every_kind_with_delete() {
    let w = replace_matrix::world();
    let run = copy(&w.src, &w.dst, &["--delete"]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.n("failed"), 0);
    assert_eq!(run.n("deleted"), replace_matrix::expected_deleted(true));
    w.check(true, &run.stderr);
    assert!(temp_names(&w.dst).is_empty(), "{:?}", temp_names(&w.dst));
}

/// The same holds through the fallback directory walk (no openat2).
#[test]
fn refusal_holds_with_the_fallback_walk_and_in_nested_directories() {
    use ferry_mover::copy::{CopyOptions, copy_tree};
    use ferry_mover::report::Progress;
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("s"), tmp.path().join("d"));
    write(&src.join("a/b/f"), b"new");
    write(&src.join("a/other"), b"o");
    write(&dst.join("a/b/f/keep/me"), b"z");
    let opts = CopyOptions {
        resolve: ferry_mover::tree::Resolve::Walk,
        ..CopyOptions::default()
    };
    let progress = std::sync::Arc::new(Progress::new("t", "copy"));
    let summary = copy_tree(&src, &dst, &opts, progress).unwrap();
    assert_eq!((summary.failed, summary.deleted, summary.files), (1, 0, 1));
    assert_eq!(std::fs::read(dst.join("a/b/f/keep/me")).unwrap(), b"z");
    assert_eq!(std::fs::read(dst.join("a/other")).unwrap(), b"o");
}
