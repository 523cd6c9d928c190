//! `kill -9` in the middle of a large file leaves no partial file at its final path, only a
//! `.ferry-tmp.*` name; the next run completes the copy and removes the leftover.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use copy_support::*;

#[test]
fn killed_copy_leaves_only_temp_names_and_next_run_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    write(&src.join("small"), b"small file");
    // Incompressible, non-sparse data so the copy takes a while.
    let mut caught = false;
    for size_mib in [512usize, 1024, 2048] {
        {
            let mut f = std::fs::File::create(src.join("zz-big")).unwrap();
            let mut block: Vec<u8> = (0..1usize << 20).map(|j| (j * 7 % 251) as u8).collect();
            for i in 0..size_mib {
                block[..8].copy_from_slice(&(i as u64).to_le_bytes());
                f.write_all(&block).unwrap();
            }
        }
        let _ = std::fs::remove_dir_all(&dst);
        let mut child = Command::new(BIN)
            .args(["copy", "--jobs", "1"])
            .arg(&src)
            .arg(&dst)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if dst.is_dir() && !temp_names(&dst).is_empty() {
                child.kill().unwrap(); // SIGKILL
                caught = true;
                break;
            }
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let _ = child.wait();
        if caught {
            break;
        }
    }
    assert!(caught, "the copy always finished before it could be killed");
    assert!(
        !dst.join("zz-big").exists(),
        "a partial file appeared at the final path"
    );
    assert!(
        !temp_names(&dst).is_empty(),
        "the killed copy left no temp file to clean"
    );

    let run = copy_ok(&src, &dst, &[]);
    assert!(run.n("temps_cleaned") >= 1, "{}", run.json);
    assert!(
        temp_names(&dst).is_empty(),
        "temp names left: {:?}",
        temp_names(&dst)
    );
    assert_same_tree(&src, &dst);
}
