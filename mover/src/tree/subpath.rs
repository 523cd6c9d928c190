//! `--sub-path`: the directory a Transfer asked for, resolved beneath a granted root.
//!
//! The operator mounts a root the admin granted (a hostPath root, a PVC's root) and names the
//! requested directory below it. The kubelet follows symlinks when it mounts a hostPath, so
//! resolving the rest here is what keeps a tenant's symlink from pointing a Transfer outside the
//! granted root. Every component is resolved with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
//! | RESOLVE_NO_MAGICLINKS)` (or the `O_NOFOLLOW` walk where openat2 is missing), so a symlink
//! anywhere on the way is refused rather than followed.
//!
//! The result is an [`Anchored`] directory handle that stays open for the whole process. The rest
//! of the mover reaches it through `/proc/self/fd/<n>`, which names that directory's dentry and not
//! a path: a component swapped for a symlink after the lookup cannot redirect it. A sender's sub
//! path may name a single file: it is opened through its directory's handle with `O_NOFOLLOW`
//! (and must be a regular file), and the sender reads that handle, never the name again.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, mkdirat, openat, statat};
use rustix::io::Errno;

use super::RelPath;
use super::confine::{Resolve, is_not_regular, open_dir_beneath, open_file_in};

/// Mode of the directories a receiver creates on the way to its sub path.
pub const CREATED_DIR_MODE: u32 = 0o755;

/// Which end resolves the sub path: the sender reads it, the receiver writes (and creates) it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Source,
    Destination,
}

impl Side {
    fn noun(self) -> &'static str {
        match self {
            Side::Source => "source",
            Side::Destination => "destination",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    /// `--sub-path` itself is not acceptable (a usage error).
    #[error("--sub-path {given:?} {why}")]
    Invalid { given: String, why: String },
    #[error(
        "{} path {component} (beneath {}) is a symbolic link; ferry does not follow symlinks on \
         the way to a Transfer's directory",
        side.noun(),
        root.display()
    )]
    Symlink {
        side: Side,
        root: PathBuf,
        component: String,
    },
    #[error("{} path {component} (beneath {}) is not a directory", side.noun(), root.display())]
    NotDirectory {
        side: Side,
        root: PathBuf,
        component: String,
    },
    #[error(
        "{} path {component} (beneath {}) is neither a directory nor a regular file ({source})",
        side.noun(),
        root.display()
    )]
    NotRegular {
        side: Side,
        root: PathBuf,
        component: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{} root {} does not exist", side.noun(), root.display())]
    RootMissing { side: Side, root: PathBuf },
    #[error("{} path {component} does not exist beneath {}", side.noun(), root.display())]
    Missing {
        side: Side,
        root: PathBuf,
        component: String,
    },
    #[error("failed to {op} {} path {shown}", side.noun())]
    Io {
        side: Side,
        op: &'static str,
        shown: String,
        #[source]
        source: std::io::Error,
    },
}

impl SubPathError {
    /// Where the fault lies: `None` for a usage error, else the side that resolved it.
    pub fn side(&self) -> Option<Side> {
        match self {
            SubPathError::Invalid { .. } => None,
            SubPathError::Symlink { side, .. }
            | SubPathError::NotDirectory { side, .. }
            | SubPathError::NotRegular { side, .. }
            | SubPathError::Missing { side, .. }
            | SubPathError::RootMissing { side, .. }
            | SubPathError::Io { side, .. } => Some(*side),
        }
    }

    /// Whether a retry cannot help: a symlink, a missing sub path, a file in the way or a denied
    /// permission stay until someone changes the tree; other I/O errors may pass.
    pub fn permanent(&self) -> bool {
        match self {
            SubPathError::Io { source, .. } => source
                .raw_os_error()
                .is_some_and(ferry_proto::kind::is_permanent_errno),
            _ => true,
        }
    }
}

/// Validates and normalises `--sub-path`: `.` components, repeated and trailing slashes are
/// dropped; `..` and absolute paths are refused. `None` when it names the root itself.
pub fn parse(given: &str) -> Result<Option<RelPath>, SubPathError> {
    let invalid = |why: &str| SubPathError::Invalid {
        given: given.to_owned(),
        why: why.to_owned(),
    };
    if given.starts_with('/') {
        return Err(invalid(
            "is absolute; it must be relative to --root (the granted root)",
        ));
    }
    let mut parts = Vec::new();
    for part in given.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(invalid(
                    "has a \"..\" component; it must stay beneath --root",
                ));
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Ok(None);
    }
    RelPath::parse(parts.join("/").as_bytes())
        .map(Some)
        .map_err(|e| invalid(&format!("is not a valid relative path: {e}")))
}

/// A resolved `--root` + `--sub-path`: the open handle and the path shown to people.
#[derive(Debug)]
pub struct Anchored {
    /// The directory the mover works in (the sub path, or for a single file its parent);
    /// `None` without a sub path: then `--root` is used as given, as it always was.
    dir: Option<OwnedFd>,
    /// For a single file named by the sub path: its name in `dir`, and the file itself, opened
    /// when it was resolved (see [`Anchored::file`]).
    file: Option<(Vec<u8>, Arc<std::fs::File>)>,
    shown: PathBuf,
}

impl Anchored {
    /// The path the rest of the mover opens: `/proc/self/fd/<n>` (plus the file name for a
    /// single file), valid as long as this value lives; `--root` itself without a sub path.
    pub fn effective(&self) -> PathBuf {
        let dir = self.effective_dir();
        match &self.file {
            Some((name, _)) => dir.join(std::ffi::OsStr::from_bytes(name)),
            None => dir,
        }
    }
    /// For a single file named by the sub path: the file, opened through its directory's
    /// handle without following a symlink and checked to be a regular file. Its name is not
    /// looked up again: whatever is swapped in for it later (a symlink to a directory outside
    /// the root, most of all) is never what is read.
    pub fn file(&self) -> Option<&Arc<std::fs::File>> {
        self.file.as_ref().map(|(_, f)| f)
    }
    /// The prefix of [`Anchored::effective`] that messages should show as
    /// [`Anchored::shown_dir`].
    pub fn effective_dir(&self) -> PathBuf {
        match &self.dir {
            Some(fd) => {
                let effective = format!("/proc/self/fd/{}", fd.as_raw_fd());
                register_alias(&effective, &self.shown);
                PathBuf::from(effective)
            }
            None => self.shown.clone(),
        }
    }
    /// `--root` joined with the sub path's directory, for messages and reports.
    pub fn shown_dir(&self) -> &Path {
        &self.shown
    }
    /// The held handle (`None` without a sub path).
    pub fn dir(&self) -> Option<BorrowedFd<'_>> {
        self.dir.as_ref().map(|fd| fd.as_fd())
    }
}

use std::os::unix::ffi::OsStrExt as _;

impl Drop for Anchored {
    fn drop(&mut self) {
        if let Some(fd) = &self.dir {
            unregister_alias(&format!("/proc/self/fd/{}", fd.as_raw_fd()));
        }
    }
}

/// The `/proc/self/fd/<n>` paths held open now, with the path people know them by: text that
/// leaves the process (an Error frame to the peer, a log line) names the latter.
static ALIASES: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

fn register_alias(effective: &str, shown: &Path) {
    let mut a = ALIASES.lock().unwrap_or_else(|e| e.into_inner());
    if !a.iter().any(|(e, _)| e == effective) {
        a.push((effective.to_owned(), shown.display().to_string()));
    }
}

fn unregister_alias(effective: &str) {
    let mut a = ALIASES.lock().unwrap_or_else(|e| e.into_inner());
    a.retain(|(e, _)| e != effective);
}

/// `text` with every held `/proc/self/fd/<n>` directory replaced by the path it was opened as.
pub fn shown_text(text: &str) -> String {
    let mut a = ALIASES.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // fd 42 before fd 4, which is its prefix.
    a.sort_by_key(|(effective, _)| std::cmp::Reverse(effective.len()));
    a.iter().fold(text.to_owned(), |t, (effective, shown)| {
        t.replace(effective.as_str(), shown)
    })
}

fn shown(root: &Path, rel: &[u8]) -> String {
    root.join(std::ffi::OsStr::from_bytes(rel))
        .display()
        .to_string()
}

fn open_root(root: &Path, side: Side) -> Result<OwnedFd, SubPathError> {
    // --root is the admin's (or the operator's mount point): trusted as given.
    openat(
        rustix::fs::CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::NOENT => SubPathError::RootMissing {
            side,
            root: root.to_owned(),
        },
        e => SubPathError::Io {
            side,
            op: "open",
            shown: root.display().to_string(),
            source: e.into(),
        },
    })
}

/// The sender's source: `--root` + `--sub-path`, a directory or a single file. Nothing is created.
pub fn open_source(root: &Path, sub: Option<&RelPath>) -> Result<Anchored, SubPathError> {
    resolve(root, sub, Side::Source)
}

/// The receiver's destination: `--root` + `--sub-path`, created one component at a time (mode
/// [`CREATED_DIR_MODE`]) where missing.
pub fn open_destination(root: &Path, sub: Option<&RelPath>) -> Result<Anchored, SubPathError> {
    resolve(root, sub, Side::Destination)
}

fn resolve(root: &Path, sub: Option<&RelPath>, side: Side) -> Result<Anchored, SubPathError> {
    let Some(sub) = sub else {
        // Without a sub path --root is the user's (trusted) path, used as before: a receiver
        // creates it when missing (not in a dry run), a sender may be given a single file. Only
        // a missing source is refused here, as a fault a retry cannot fix.
        if side == Side::Source
            && let Err(e) = std::fs::metadata(root)
        {
            return Err(match e.kind() {
                std::io::ErrorKind::NotFound => SubPathError::RootMissing {
                    side,
                    root: root.to_owned(),
                },
                _ => SubPathError::Io {
                    side,
                    op: "read",
                    shown: root.display().to_string(),
                    source: e,
                },
            });
        }
        return Ok(Anchored {
            dir: None,
            file: None,
            shown: root.to_owned(),
        });
    };
    let root_fd = open_root(root, side)?;
    // The fast path: one atomic lookup of the whole sub path.
    if let Ok(dir) = open_dir_beneath(root_fd.as_fd(), sub, Resolve::Auto) {
        return Ok(Anchored {
            dir: Some(dir),
            file: None,
            shown: root.join(std::ffi::OsStr::from_bytes(sub.as_bytes())),
        });
    }
    // Otherwise walk it once more, one component at a time, to name what is wrong (and on the
    // receiver to create what is missing).
    let mut current = root_fd;
    let names: Vec<&[u8]> = sub.components().collect();
    let mut prefix: Vec<u8> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if !prefix.is_empty() {
            prefix.push(b'/');
        }
        prefix.extend_from_slice(name);
        let last = i + 1 == names.len();
        let one = RelPath::from_name(name).map_err(|e| SubPathError::Invalid {
            given: String::from_utf8_lossy(sub.as_bytes()).into_owned(),
            why: e.to_string(),
        })?;
        let component = || String::from_utf8_lossy(&prefix).into_owned();
        match open_dir_beneath(current.as_fd(), &one, Resolve::Auto) {
            Ok(fd) => current = fd,
            Err(e) => match classify(current.as_fd(), name, e) {
                Found::Symlink => {
                    return Err(SubPathError::Symlink {
                        side,
                        root: root.to_owned(),
                        component: component(),
                    });
                }
                Found::File if last && side == Side::Source => {
                    // A single file: opened now, through its parent's handle and without
                    // following a symlink (one swapped in since the check above is refused
                    // here), and read from this handle from now on.
                    let file = open_file_in(current.as_fd(), name).map_err(|e| {
                        if e.raw_os_error() == Some(libc::ELOOP) {
                            SubPathError::Symlink {
                                side,
                                root: root.to_owned(),
                                component: component(),
                            }
                        } else if is_not_regular(&e) {
                            SubPathError::NotRegular {
                                side,
                                root: root.to_owned(),
                                component: component(),
                                source: e,
                            }
                        } else {
                            SubPathError::Io {
                                side,
                                op: "open",
                                shown: shown(root, &prefix),
                                source: e,
                            }
                        }
                    })?;
                    return Ok(Anchored {
                        dir: Some(current),
                        file: Some((name.to_vec(), Arc::new(file))),
                        shown: root.join(std::ffi::OsStr::from_bytes(
                            sub.parent().as_ref().map_or(&b""[..], |p| p.as_bytes()),
                        )),
                    });
                }
                Found::File => {
                    return Err(SubPathError::NotDirectory {
                        side,
                        root: root.to_owned(),
                        component: component(),
                    });
                }
                Found::Missing if side == Side::Destination => {
                    current = create_one(current.as_fd(), &one).map_err(|e| match e {
                        Errno::LOOP | Errno::XDEV => SubPathError::Symlink {
                            side,
                            root: root.to_owned(),
                            component: component(),
                        },
                        e => SubPathError::Io {
                            side,
                            op: "create",
                            shown: shown(root, &prefix),
                            source: e.into(),
                        },
                    })?;
                }
                Found::Missing => {
                    return Err(SubPathError::Missing {
                        side,
                        root: root.to_owned(),
                        component: component(),
                    });
                }
                Found::Other(e) => {
                    return Err(SubPathError::Io {
                        side,
                        op: "open",
                        shown: shown(root, &prefix),
                        source: e.into(),
                    });
                }
            },
        }
    }
    Ok(Anchored {
        dir: Some(current),
        file: None,
        shown: root.join(std::ffi::OsStr::from_bytes(sub.as_bytes())),
    })
}

enum Found {
    Symlink,
    File,
    Missing,
    Other(Errno),
}

/// What made opening `name` in `dir` as a directory fail.
fn classify(dir: BorrowedFd<'_>, name: &[u8], e: Errno) -> Found {
    match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => Found::Symlink,
            FileType::Directory => Found::Other(e),
            _ => Found::File,
        },
        Err(Errno::NOENT) => Found::Missing,
        Err(_) => Found::Other(e),
    }
}

/// Creates the directory `one` in `dir` and opens it with the same refusal of symlinks. Another
/// process creating it first (EEXIST) is fine; a symlink planted in the race is refused by the
/// open.
fn create_one(dir: BorrowedFd<'_>, one: &RelPath) -> Result<OwnedFd, Errno> {
    let created = match mkdirat(dir, one.as_bytes(), Mode::from_raw_mode(CREATED_DIR_MODE)) {
        Ok(()) => true,
        Err(Errno::EXIST) => false,
        Err(e) => return Err(e),
    };
    let fd = open_dir_beneath(dir, one, Resolve::Auto)?;
    if created {
        // The umask must not decide the mode of a Transfer's directory.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(CREATED_DIR_MODE))?;
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_leaving_the_process_names_the_directory_not_its_held_handle() {
        let tmp = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(tmp.path().join("a/b")).expect("mkdir");
        let sub = parse("a/b").expect("parse");
        let anchored = open_source(tmp.path(), sub.as_ref()).expect("open");
        let effective = anchored.effective().display().to_string();
        assert!(effective.starts_with("/proc/self/fd/"), "{effective}");
        let message = format!("failed to open directory {effective}/private: Permission denied");
        let shown = shown_text(&message);
        assert_eq!(
            shown,
            format!(
                "failed to open directory {}/private: Permission denied",
                tmp.path().join("a/b").display()
            )
        );
        drop(anchored);
        assert_eq!(
            shown_text(&message),
            message,
            "a closed handle is forgotten"
        );
    }

    #[test]
    fn sub_paths_are_normalised_and_must_stay_beneath_the_root() {
        let p = |s: &str| parse(s).map(|r| r.map(|r| r.to_string()));
        assert_eq!(p("").expect("empty"), None);
        assert_eq!(p("./").expect("dot"), None);
        assert_eq!(p("a//b/./c/").expect("ok"), Some("a/b/c".to_owned()));
        for bad in ["..", "a/../b", "/abs", "a/.."] {
            assert!(
                matches!(parse(bad), Err(SubPathError::Invalid { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_symlink_is_named_and_a_missing_destination_is_created() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(tmp.path().join("a/b")).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("a/esc")).expect("symlink");
        let rel = |s: &str| parse(s).expect("valid");
        let err = open_destination(tmp.path(), rel("a/esc/x").as_ref()).expect_err("symlink");
        assert!(err.to_string().contains("path a/esc (beneath"), "{err}");
        assert_eq!(err.side(), Some(Side::Destination));
        assert!(err.permanent());
        let err = open_source(tmp.path(), rel("a/nope").as_ref()).expect_err("missing");
        assert!(matches!(err, SubPathError::Missing { .. }), "{err}");
        let got = open_destination(tmp.path(), rel("a/b/c/d").as_ref()).expect("created");
        assert_eq!(got.shown_dir(), tmp.path().join("a/b/c/d"));
        assert!(tmp.path().join("a/b/c/d").is_dir());
        assert_eq!(std::fs::read_dir(outside.path()).expect("ls").count(), 0);
    }

    /// A sub path naming a single file holds the file from its resolution on: a symlink (to a
    /// directory outside the root) swapped in for its name afterwards changes nothing of what
    /// is read. The swap between the check and the open inside `resolve` cannot be timed from
    /// here; the open refuses a symlink there, as it does one that is there from the start.
    #[test]
    fn a_single_file_is_held_open_from_its_resolution() {
        use std::io::Read as _;
        let tmp = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret"), b"secret").expect("write");
        std::fs::create_dir_all(tmp.path().join("d")).expect("mkdir");
        std::fs::write(tmp.path().join("d/f"), b"the file").expect("write");
        let rel = |s: &str| parse(s).expect("valid");
        let anchored = open_source(tmp.path(), rel("d/f").as_ref()).expect("a file");
        std::fs::rename(tmp.path().join("d/f"), tmp.path().join("d/old")).expect("rename");
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("d/f")).expect("symlink");
        let mut read = String::new();
        crate::tree::confine::reopen(anchored.file().expect("held"))
            .expect("reopen")
            .read_to_string(&mut read)
            .expect("read");
        assert_eq!(read, "the file");
        // Resolved now, the symlink is refused, and so is a FIFO.
        let err = open_source(tmp.path(), rel("d/f").as_ref()).expect_err("a symlink");
        assert!(matches!(err, SubPathError::Symlink { .. }), "{err}");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            tmp.path().join("d/pipe"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        let err = open_source(tmp.path(), rel("d/pipe").as_ref()).expect_err("a FIFO");
        assert!(matches!(err, SubPathError::NotRegular { .. }), "{err}");
        assert!(err.to_string().contains("FIFO"), "{err}");
        assert!(err.permanent());
    }
}
