//! `--json` prints exactly one summary line with the documented fields and true counts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use copy_support::*;

#[test]
fn json_summary_counts_what_was_done() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    let mut bytes = 0;
    for i in 0..30usize {
        let data = vec![b'x'; i * 1000];
        bytes += data.len() as u64;
        write(&src.join(format!("d{}/f{i}", i % 3)), &data);
    }
    std::fs::create_dir_all(src.join("empty")).unwrap();
    let run = copy_ok(&src, &dst, &["--jobs", "3"]);
    assert_eq!(run.stdout.lines().count(), 1, "stdout: {}", run.stdout);
    for key in ["files", "bytes", "skipped", "failed", "seconds"] {
        assert!(run.json.get(key).is_some(), "{key} missing: {}", run.json);
    }
    assert_eq!(run.n("files"), 30);
    assert_eq!(run.n("bytes"), bytes);
    assert_eq!(run.n("dirs"), 4);
    assert!(run.json["seconds"].as_f64().unwrap() > 0.0);
    assert_same_tree(&src, &dst);
}
