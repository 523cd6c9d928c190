//! `kill -9` in the middle of a large file leaves no partial file at its final path (the data was
//! in an anonymous O_TMPFILE inode or under a `.ferry-tmp.*` name); the next run completes the
//! copy, and leftover `.ferry-tmp.*` names of an interrupted run are removed.
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
            // Only once `small` is in place is the file being staged surely `zz-big`.
            if dst.join("small").exists()
                && (!temp_names(&dst).is_empty() || writing_staged_file(child.id(), &dst))
            {
                child.kill().unwrap(); // SIGKILL
                caught = true;
                break;
            }
            if child.try_wait().unwrap().is_some() {
                break;
            }
            // Poll interval of a condition wait with a deadline, not synchronization.
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

    let run = copy_ok(&src, &dst, &[]);
    assert_eq!(
        run.n("files"),
        1,
        "only the big file was missing: {}",
        run.json
    );
    assert!(
        temp_names(&dst).is_empty(),
        "temp names left: {:?}",
        temp_names(&dst)
    );
    assert_same_tree(&src, &dst);
}

/// True while process `pid` holds open a file being staged in `dst`: an O_TMPFILE inode shows in
/// /proc as `<dir>/#<inode> (deleted)`.
fn writing_staged_file(pid: u32, dst: &std::path::Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let prefix = dst.to_string_lossy().into_owned();
    fds.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| t.to_string_lossy().into_owned())
        .any(|t| t.starts_with(&prefix) && (t.contains("/#") || t.contains("/.ferry-tmp.")))
}

#[test]
fn stale_temp_files_of_an_interrupted_run_are_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    write(&src.join("d/f"), b"data");
    copy_ok(&src, &dst, &[]);
    write(&dst.join("d/.ferry-tmp.4d2.7"), b"torn half of something");
    write(&dst.join(".ferry-tmp.4d2.8"), b"torn");
    let run = copy_ok(&src, &dst, &[]);
    assert_eq!(run.n("temps_cleaned"), 2, "{}", run.json);
    assert!(temp_names(&dst).is_empty());
    assert_same_tree(&src, &dst);
}
