//! What `-v` (names) and `-i` (rsync's itemized codes) print: one line per entry that changed,
//! on stdout, as the change is made (or, with `--dry-run`, found).
//!
//! `-i` lines are rsync's `YXcstpoguax PATH`: `Y` is `>` for file data written, `c` for a
//! directory or symlink created or changed, `h` for a hard link, `*deleting` for a removal;
//! `X` the kind (`f`, `d`, `L`); then `+++++++++` for a new entry, or `.` per attribute with
//! the letter of each that differs (`c` contents or link target, `s` size, `t` mtime, `p`
//! permissions).

use std::io::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::tree::Meta;

/// How changes are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    Off,
    /// `-v`: the path of each changed entry.
    Names,
    /// `-i`: rsync's itemized change code and the path.
    Itemized,
}

static LISTING: AtomicU8 = AtomicU8::new(0);

/// Set once from the command line.
pub fn set_listing(listing: Listing) {
    let v = match listing {
        Listing::Off => 0,
        Listing::Names => 1,
        Listing::Itemized => 2,
    };
    LISTING.store(v, Ordering::Relaxed);
}

pub fn listing() -> Listing {
    match LISTING.load(Ordering::Relaxed) {
        1 => Listing::Names,
        2 => Listing::Itemized,
        _ => Listing::Off,
    }
}

/// One change to an entry of the destination.
#[derive(Debug)]
pub enum Change<'a> {
    /// File data written; `old` is the file it replaced (None: nothing, or another kind).
    File {
        old: Option<&'a Meta>,
        new: &'a Meta,
    },
    /// A directory created.
    Dir,
    /// A symlink created (`replaced`: another link was there).
    Symlink { target: &'a [u8], replaced: bool },
    /// A hard link made to `target`.
    HardLink { target: &'a [u8] },
    /// An entry removed.
    Deleted { dir: bool },
}

/// Prints the line for `change` at `path` (relative to the destination) when listing is on.
pub fn report(change: &Change<'_>, path: &[u8]) {
    let mode = listing();
    if mode == Listing::Off {
        return;
    }
    let line = render(mode, change, path);
    // A closed stdout (`| head`) must not fail the copy.
    let _ = std::io::stdout().lock().write_all(&line);
}

/// The sender's listing: a file whose data goes to the receiver (rsync's `<f` for sent). Only
/// the receiver sees the destination, so only it tells new from updated and lists deletions.
pub fn report_sent(path: &[u8]) {
    let line = match listing() {
        Listing::Off => return,
        Listing::Names => [path, b"\n"].concat(),
        Listing::Itemized => [b"<f......... ", path, b"\n"].concat(),
    };
    let _ = std::io::stdout().lock().write_all(&line);
}

fn render(mode: Listing, change: &Change<'_>, path: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(path.len() + 24);
    let dir_suffix: &[u8] = match change {
        Change::Dir | Change::Deleted { dir: true } => b"/",
        _ => b"",
    };
    if mode == Listing::Itemized {
        line.extend_from_slice(code(change).as_bytes());
        line.push(b' ');
    } else if matches!(change, Change::Deleted { .. }) {
        line.extend_from_slice(b"deleting ");
    }
    line.extend_from_slice(path);
    line.extend_from_slice(dir_suffix);
    match change {
        Change::Symlink { target, .. } => {
            line.extend_from_slice(b" -> ");
            line.extend_from_slice(target);
        }
        Change::HardLink { target } => {
            line.extend_from_slice(b" => ");
            line.extend_from_slice(target);
        }
        _ => {}
    }
    line.push(b'\n');
    line
}

/// The 11-character itemize code.
fn code(change: &Change<'_>) -> String {
    const NEW: &str = "+++++++++";
    match change {
        Change::File { old: None, .. } => format!(">f{NEW}"),
        Change::File {
            old: Some(old),
            new,
        } => {
            let flag = |differs: bool, c: char| if differs { c } else { '.' };
            let same_size = old.size == new.size;
            format!(
                ">f{}{}{}{}.....",
                // Same size and time but rewritten: only a checksum can have told them apart.
                flag(same_size && old.same_size_and_mtime(new), 'c'),
                flag(!same_size, 's'),
                flag(
                    (old.mtime_sec, old.mtime_nsec) != (new.mtime_sec, new.mtime_nsec),
                    't'
                ),
                flag(old.mode & 0o7777 != new.mode & 0o7777, 'p'),
            )
        }
        Change::Dir => format!("cd{NEW}"),
        Change::Symlink {
            replaced: false, ..
        } => format!("cL{NEW}"),
        Change::Symlink { replaced: true, .. } => "cLc........".to_owned(),
        Change::HardLink { .. } => format!("hf{NEW}"),
        Change::Deleted { .. } => "*deleting  ".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Kind;

    fn line(mode: Listing, change: &Change<'_>, path: &str) -> String {
        String::from_utf8(render(mode, change, path.as_bytes())).expect("utf8")
    }

    #[test]
    fn itemized_codes_follow_rsync() {
        let old = Meta::new(Kind::File, 0o644, 10, 100, 0);
        let grown = Meta::new(Kind::File, 0o600, 12, 200, 0);
        let touched = Meta::new(Kind::File, 0o644, 10, 100, 0);
        let i = Listing::Itemized;
        assert_eq!(
            line(
                i,
                &Change::File {
                    old: None,
                    new: &old
                },
                "a"
            ),
            ">f+++++++++ a\n"
        );
        assert_eq!(
            line(
                i,
                &Change::File {
                    old: Some(&old),
                    new: &grown
                },
                "a"
            ),
            ">f.stp..... a\n"
        );
        assert_eq!(
            line(
                i,
                &Change::File {
                    old: Some(&old),
                    new: &touched
                },
                "a"
            ),
            ">fc........ a\n"
        );
        assert_eq!(line(i, &Change::Dir, "d"), "cd+++++++++ d/\n");
        let link = Change::Symlink {
            target: b"../t",
            replaced: false,
        };
        assert_eq!(line(i, &link, "l"), "cL+++++++++ l -> ../t\n");
        assert_eq!(
            line(i, &Change::HardLink { target: b"a" }, "b"),
            "hf+++++++++ b => a\n"
        );
        assert_eq!(
            line(i, &Change::Deleted { dir: true }, "old"),
            "*deleting   old/\n"
        );
        for c in [">f+++++++++", "*deleting  ", "cLc........"] {
            assert_eq!(c.len(), 11);
        }
    }

    #[test]
    fn names_are_paths_and_deletions_say_so() {
        let n = Listing::Names;
        let m = Meta::new(Kind::File, 0o644, 1, 1, 0);
        assert_eq!(
            line(n, &Change::File { old: None, new: &m }, "x/y"),
            "x/y\n"
        );
        assert_eq!(line(n, &Change::Dir, "x"), "x/\n");
        assert_eq!(
            line(n, &Change::Deleted { dir: false }, "z"),
            "deleting z\n"
        );
    }
}
