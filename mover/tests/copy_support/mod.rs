//! Shared helpers for the `copy_*` integration tests: run the real binary, compare trees.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_ferry-mover");

/// Result of one `ferry-mover copy` run.
pub struct Run {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub json: serde_json::Value,
}

impl Run {
    pub fn n(&self, key: &str) -> u64 {
        self.json[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} missing in {}", self.json))
    }
}

pub fn parse(out: Output) -> Run {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null);
    Run {
        status: out.status,
        stdout,
        stderr,
        json,
    }
}

/// `ferry-mover copy --json SRC DST EXTRA...`
pub fn copy(src: &Path, dst: &Path, extra: &[&str]) -> Run {
    let out = Command::new(BIN)
        .arg("copy")
        .arg("--json")
        .args(extra)
        .arg(src)
        .arg(dst)
        .output()
        .expect("run ferry-mover");
    parse(out)
}

/// Like [`copy`] but asserts success and no failures.
pub fn copy_ok(src: &Path, dst: &Path, extra: &[&str]) -> Run {
    let run = copy(src, dst, extra);
    assert!(
        run.status.success(),
        "copy failed: {}\n{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(run.n("failed"), 0, "{}", run.stderr);
    run
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Sets mtime (and atime) with nanoseconds, without following symlinks.
pub fn set_mtime(path: &Path, sec: i64, nsec: i64) {
    let ts = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &ts,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .expect("utimensat");
}

pub fn write(path: &Path, data: &[u8]) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).expect("mkdir");
    }
    std::fs::write(path, data).expect("write");
}

/// Every entry beneath `root` (relative path, lstat), sorted.
pub fn walk(root: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let e = e.expect("entry");
            let md = std::fs::symlink_metadata(e.path()).expect("lstat");
            if md.is_dir() {
                stack.push(e.path());
            }
            out.push((
                e.path().strip_prefix(root).expect("prefix").to_path_buf(),
                md,
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Asserts that `dst` mirrors `src`: same entries (FIFOs etc. excluded), kinds, modes, mtimes to
/// the nanosecond, contents and link targets; owners too when running as root.
pub fn assert_same_tree(src: &Path, dst: &Path) {
    let a: Vec<_> = walk(src)
        .into_iter()
        .filter(|(_, m)| !is_special(m))
        .collect();
    let b = walk(dst);
    let names_a: Vec<_> = a.iter().map(|(p, _)| p.clone()).collect();
    let names_b: Vec<_> = b.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(names_a, names_b, "entry lists differ");
    for ((path, ma), (_, mb)) in a.iter().zip(b.iter()) {
        assert_eq!(ma.file_type(), mb.file_type(), "{path:?} kind");
        if !ma.file_type().is_symlink() {
            assert_eq!(ma.mode() & 0o7777, mb.mode() & 0o7777, "{path:?} mode");
        }
        assert_eq!(
            (ma.mtime(), ma.mtime_nsec()),
            (mb.mtime(), mb.mtime_nsec()),
            "{path:?} mtime"
        );
        if is_root() {
            assert_eq!((ma.uid(), ma.gid()), (mb.uid(), mb.gid()), "{path:?} owner");
        }
        if ma.is_file() {
            assert_eq!(ma.len(), mb.len(), "{path:?} size");
            assert!(
                std::fs::read(src.join(path)).expect("read")
                    == std::fs::read(dst.join(path)).expect("read"),
                "{path:?} contents differ"
            );
        }
        if ma.file_type().is_symlink() {
            assert_eq!(
                std::fs::read_link(src.join(path)).expect("readlink"),
                std::fs::read_link(dst.join(path)).expect("readlink"),
                "{path:?} link target"
            );
        }
    }
}

fn is_special(m: &std::fs::Metadata) -> bool {
    let t = m.file_type();
    t.is_fifo() || t.is_socket() || t.is_block_device() || t.is_char_device()
}

/// Names of leftover temporary files beneath `root`.
pub fn temp_names(root: &Path) -> Vec<PathBuf> {
    walk(root)
        .into_iter()
        .filter(|(p, _)| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".ferry-tmp."))
        })
        .map(|(p, _)| p)
        .collect()
}
