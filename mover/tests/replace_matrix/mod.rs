//! Every pair of (source kind, destination kind) at one name, for the local and the network
//! tests of the replacement rule: without `--delete` a non-empty destination directory is never
//! replaced by a non-directory (the entry fails, the rest is copied); with `--delete` it is, and
//! counts as deleted; every other pair ends with the source's kind, except special source
//! entries, which are skipped and leave the destination untouched.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The kind of entry at one name, on either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    /// A directory with entries (on the destination: `inner` holding "z" and `deep/x`).
    Dir,
    EmptyDir,
    Symlink,
    /// A FIFO.
    Special,
}

pub const KINDS: [Kind; 5] = [
    Kind::File,
    Kind::Dir,
    Kind::EmptyDir,
    Kind::Symlink,
    Kind::Special,
];

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::EmptyDir => "empty-dir",
            Kind::Symlink => "symlink",
            Kind::Special => "fifo",
        }
    }
    fn is_dir(self) -> bool {
        matches!(self, Kind::Dir | Kind::EmptyDir)
    }
}

/// The name of the entry for one pair, e.g. `file-over-dir`.
pub fn name(src: Kind, dst: Kind) -> String {
    format!("{}-over-{}", src.label(), dst.label())
}

/// Two names that are hard links of each other in the source, where the destination has
/// non-empty directories.
pub const HARD_LINKS: [&str; 2] = ["hl-a", "hl-b"];

/// What must become of one pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The non-empty destination directory stays, with its contents; the entry failed.
    Refused,
    /// The destination holds the source's kind.
    Source,
    /// The destination is as it was (a special source entry is skipped).
    Untouched,
}

pub fn outcome(src: Kind, dst: Kind, delete: bool) -> Outcome {
    match (src, dst) {
        (Kind::Special, _) => Outcome::Untouched,
        (Kind::File | Kind::Symlink, Kind::Dir) if !delete => Outcome::Refused,
        _ => Outcome::Source,
    }
}

/// Entries `--delete` removes for one pair: the replaced non-empty directory (one), or the two
/// entries of a non-empty destination directory whose source directory lacks them.
pub fn deleted(src: Kind, dst: Kind, delete: bool) -> u64 {
    match (delete, src, dst) {
        (true, Kind::File | Kind::Symlink, Kind::Dir) => 1,
        (true, Kind::Dir | Kind::EmptyDir, Kind::Dir) => 2,
        _ => 0,
    }
}

fn pairs() -> impl Iterator<Item = (Kind, Kind)> {
    KINDS
        .into_iter()
        .flat_map(|s| KINDS.into_iter().map(move |d| (s, d)))
}

/// Entries counted as failed for the whole run: the refused pairs and both hard links.
pub fn expected_failed(delete: bool) -> u64 {
    let pairs = pairs()
        .filter(|(s, d)| outcome(*s, *d, delete) == Outcome::Refused)
        .count() as u64;
    if delete { pairs } else { pairs + 2 }
}

/// `deleted` for the whole run.
pub fn expected_deleted(delete: bool) -> u64 {
    let pairs: u64 = pairs().map(|(s, d)| deleted(s, d, delete)).sum();
    if delete { pairs + 2 } else { pairs }
}

/// Source, destination and a directory outside both that a destination symlink points to.
pub struct World {
    _tmp: tempfile::TempDir,
    pub src: PathBuf,
    pub dst: PathBuf,
    pub outside: PathBuf,
}

/// Builds every pair, two hard links over non-empty directories, and `rest/file` (which must be
/// copied whatever fails).
pub fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    let outside = tmp.path().join("outside");
    for d in [&src, &dst, &outside] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(outside.join("keep"), b"outside").unwrap();
    for (s, d) in pairs() {
        let n = name(s, d);
        make_src(&src.join(&n), s, &n);
        make_dst(&dst.join(&n), d, &outside);
    }
    std::fs::write(src.join(HARD_LINKS[0]), b"linked").unwrap();
    std::fs::hard_link(src.join(HARD_LINKS[0]), src.join(HARD_LINKS[1])).unwrap();
    for n in HARD_LINKS {
        make_dst(&dst.join(n), Kind::Dir, &outside);
    }
    std::fs::create_dir(src.join("rest")).unwrap();
    std::fs::write(src.join("rest/file"), b"the rest").unwrap();
    World {
        _tmp: tmp,
        src,
        dst,
        outside,
    }
}

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

fn make_src(path: &Path, kind: Kind, name: &str) {
    match kind {
        Kind::File => std::fs::write(path, format!("source {name}")).unwrap(),
        Kind::Dir => {
            std::fs::create_dir(path).unwrap();
            std::fs::write(path.join("child"), b"c").unwrap();
        }
        Kind::EmptyDir => std::fs::create_dir(path).unwrap(),
        Kind::Symlink => std::os::unix::fs::symlink(format!("target-of-{name}"), path).unwrap(),
        Kind::Special => mkfifo(path),
    }
}

fn make_dst(path: &Path, kind: Kind, outside: &Path) {
    match kind {
        Kind::File => std::fs::write(path, b"old").unwrap(),
        Kind::Dir => {
            std::fs::create_dir_all(path.join("deep")).unwrap();
            std::fs::write(path.join("inner"), b"z").unwrap();
            std::fs::write(path.join("deep/x"), b"x").unwrap();
        }
        Kind::EmptyDir => std::fs::create_dir(path).unwrap(),
        Kind::Symlink => std::os::unix::fs::symlink(outside, path).unwrap(),
        Kind::Special => mkfifo(path),
    }
}

impl World {
    /// Checks every pair, the hard links, the rest of the tree and the outside directory.
    /// `messages` is what the run reported (stderr, or the Summary's failure messages): every
    /// refusal must name its path there.
    pub fn check(&self, delete: bool, messages: &str) {
        for (s, d) in pairs() {
            let n = name(s, d);
            let path = self.dst.join(&n);
            let label = format!("{n} (delete: {delete})");
            match outcome(s, d, delete) {
                Outcome::Refused => {
                    check_dst(&path, Kind::Dir, &self.outside, &label);
                    // copy names the whole destination path, a receiver the path in its root.
                    let wanted = format!("refusing to replace non-empty directory {n} with");
                    let whole = format!(
                        "refusing to replace non-empty directory {} with",
                        path.display()
                    );
                    assert!(
                        messages.contains(&wanted) || messages.contains(&whole),
                        "{label}: {wanted:?} not in {messages}"
                    );
                }
                Outcome::Untouched => check_dst(&path, d, &self.outside, &label),
                Outcome::Source => check_src(&path, s, &n, delete, &label),
            }
        }
        self.check_hard_links(delete);
        assert_eq!(
            std::fs::read(self.dst.join("rest/file")).unwrap(),
            b"the rest",
            "the rest of the tree is copied"
        );
        let outside: Vec<_> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(outside, ["keep"], "outside directory changed");
        assert_eq!(
            std::fs::read(self.outside.join("keep")).unwrap(),
            b"outside"
        );
    }

    fn check_hard_links(&self, delete: bool) {
        let [a, b] = HARD_LINKS.map(|n| self.dst.join(n));
        if delete {
            assert_eq!(std::fs::read(&a).unwrap(), b"linked");
            let ino = |p: &Path| std::fs::symlink_metadata(p).unwrap().ino();
            assert_eq!(ino(&a), ino(&b), "hard links joined");
        } else {
            for p in [a, b] {
                check_dst(
                    &p,
                    Kind::Dir,
                    &self.outside,
                    "hard link over a non-empty dir",
                );
            }
        }
    }
}

/// The destination entry is still what [`make_dst`] made.
fn check_dst(path: &Path, kind: Kind, outside: &Path, label: &str) {
    let md = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{label}: {e}"));
    let ft = md.file_type();
    match kind {
        Kind::File => assert_eq!(std::fs::read(path).unwrap(), b"old", "{label}"),
        Kind::Dir => {
            assert!(ft.is_dir(), "{label}: directory kept");
            assert_eq!(std::fs::read(path.join("inner")).unwrap(), b"z", "{label}");
            assert_eq!(std::fs::read(path.join("deep/x")).unwrap(), b"x", "{label}");
        }
        Kind::EmptyDir => assert!(ft.is_dir() && is_empty(path), "{label}"),
        Kind::Symlink => assert_eq!(std::fs::read_link(path).unwrap(), outside, "{label}"),
        Kind::Special => assert!(ft.is_fifo(), "{label}: FIFO kept"),
    }
}

/// The destination entry is what the source has (with `--delete`, nothing more).
fn check_src(path: &Path, kind: Kind, name: &str, delete: bool, label: &str) {
    let md = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{label}: {e}"));
    let ft = md.file_type();
    match kind {
        Kind::File => {
            assert!(ft.is_file(), "{label}: a file");
            assert_eq!(
                std::fs::read(path).unwrap(),
                format!("source {name}").as_bytes(),
                "{label}"
            );
        }
        Kind::Dir | Kind::EmptyDir => {
            assert!(ft.is_dir(), "{label}: a directory");
            let mut names: Vec<_> = std::fs::read_dir(path)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let has_child = names.iter().any(|n| n == "child");
            assert_eq!(has_child, kind == Kind::Dir, "{label}: {names:?}");
            if kind == Kind::Dir {
                assert_eq!(std::fs::read(path.join("child")).unwrap(), b"c", "{label}");
            }
            if delete {
                let expected: &[&str] = if kind == Kind::Dir { &["child"] } else { &[] };
                assert_eq!(
                    names, expected,
                    "{label}: --delete leaves only the source's"
                );
            }
        }
        Kind::Symlink => {
            assert!(ft.is_symlink(), "{label}: a symlink");
            assert_eq!(
                std::fs::read_link(path).unwrap(),
                PathBuf::from(format!("target-of-{name}")),
                "{label}"
            );
        }
        Kind::Special => unreachable!("special source entries are never copied"),
    }
    assert!(
        kind.is_dir() || !ft.is_dir(),
        "{label}: no directory left behind"
    );
}

fn is_empty(path: &Path) -> bool {
    std::fs::read_dir(path).unwrap().next().is_none()
}
