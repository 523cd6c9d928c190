//! `copy -n` changes nothing and reports what the copy would do; `-i` itemizes with rsync's
//! codes and `-v` lists names; a dry run lists exactly what the real run then does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use copy_support::*;

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
    set_mtime(&src.join("same.txt"), 1_600_000_000, 5);
    set_mtime(&dst.join("same.txt"), 1_600_000_000, 5);
    set_mtime(&src.join("grown.txt"), 1_700_000_000, 0);
    set_mtime(&dst.join("grown.txt"), 1_600_000_000, 0);
    (src, dst)
}

/// Every entry with its kind, size, mtime and content: what a dry run must leave alone.
fn snapshot(root: &Path) -> Vec<String> {
    walk(root)
        .into_iter()
        .map(|(p, md)| {
            let data = if md.is_file() {
                std::fs::read(root.join(&p)).unwrap()
            } else {
                Vec::new()
            };
            format!(
                "{} {:o} {} {} {:?}",
                p.display(),
                md.mode(),
                md.size(),
                md.mtime(),
                data
            )
        })
        .collect()
}

fn sorted_lines(stdout: &str) -> Vec<String> {
    let mut v: Vec<String> = stdout
        .lines()
        .filter(|l| !l.starts_with('{'))
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

#[test]
fn a_dry_run_changes_nothing_and_itemizes_what_the_real_run_does() {
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = setup(base.path());
    let before = snapshot(&dst);
    let dry = copy(&src, &dst, &["-n", "-i", "--delete"]);
    assert!(dry.status.success(), "{}", dry.stderr);
    assert_eq!(
        snapshot(&dst),
        before,
        "the dry run changed the destination"
    );
    assert_eq!(dry.json["dry_run"], true, "{}", dry.json);
    assert_eq!(
        (dry.n("files"), dry.n("skipped"), dry.n("deleted")),
        (3, 1, 2)
    );
    let planned = sorted_lines(&dry.stdout);
    assert_eq!(
        planned,
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
    let real = copy_ok(&src, &dst, &["-i", "--delete"]);
    assert_eq!(
        sorted_lines(&real.stdout),
        planned,
        "the real run did something else"
    );
    assert_eq!(
        (real.n("files"), real.n("skipped"), real.n("deleted")),
        (3, 1, 2)
    );
    assert_same_tree(&src, &dst);
    // Nothing left to do: a dry run lists nothing, a real run neither.
    let again = copy(&src, &dst, &["-n", "-i", "--delete"]);
    assert!(sorted_lines(&again.stdout).is_empty(), "{}", again.stdout);
    assert_eq!(again.n("skipped"), 5);
}

#[test]
fn verbose_lists_names() {
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = setup(base.path());
    let run = copy_ok(&src, &dst, &["-v", "--delete"]);
    assert_eq!(
        sorted_lines(&run.stdout),
        [
            "d/",
            "d/inner",
            "deleting extra",
            "deleting gone/",
            "grown.txt",
            "link -> new.txt",
            "new.txt",
        ]
    );
}

#[test]
fn a_dry_run_reports_the_refusal_a_copy_would_make() {
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    write(&src.join("f"), b"file");
    write(&dst.join("f/inner"), b"keep me");
    let dry = copy(&src, &dst, &["-n"]);
    assert_eq!(dry.status.code(), Some(1), "{}", dry.stderr);
    assert!(
        dry.stderr.contains(&format!(
            "refusing to replace non-empty directory {} with a file",
            dst.join("f").display()
        )),
        "{}",
        dry.stderr
    );
    assert_eq!(std::fs::read(dst.join("f/inner")).unwrap(), b"keep me");
}
