//! Validated relative paths: the only path type the destination side accepts.
//!
//! Paths arrive from users and from network peers as raw bytes. A [`RelPath`] is proof that the
//! bytes name something *beneath* a root: no leading `/`, no `.` or `..` components, no empty
//! components, no NUL, and bounded lengths. Callers then resolve it one component at a time under a
//! directory handle (see [`crate::tree::DestRoot`]); nothing ever joins it onto a string path.

use std::fmt;

/// Longest single component, as on Linux (`NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;
/// Longest whole relative path, as on Linux (`PATH_MAX` minus the terminating NUL).
pub const MAX_PATH_LEN: usize = 4095;

/// Why a byte string is not an acceptable relative path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is empty")]
    Empty,
    #[error("path {0:?} is absolute")]
    Absolute(String),
    #[error("path {0:?} contains a NUL byte")]
    Nul(String),
    #[error("path {0:?} has an empty component (\"//\" or a trailing \"/\")")]
    EmptyComponent(String),
    #[error("path {0:?} has a \".\" component")]
    Dot(String),
    #[error("path {0:?} has a \"..\" component")]
    DotDot(String),
    #[error("path {path:?} has a component of {len} bytes (limit {MAX_NAME_LEN})")]
    NameTooLong { path: String, len: usize },
    #[error("path of {len} bytes is longer than the limit of {MAX_PATH_LEN}")]
    TooLong { len: usize },
    #[error("name {0:?} contains a \"/\"")]
    Slash(String),
}

/// A non-empty relative path whose components are plain names (see the module docs).
///
/// Stored as the original bytes with `/` separators; components are never `.`/`..`/empty.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(Box<[u8]>);

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Checks one component; `whole` is only used for the error message.
fn check_name(name: &[u8], whole: &[u8]) -> Result<(), PathError> {
    match name {
        b"" => Err(PathError::EmptyComponent(lossy(whole))),
        b"." => Err(PathError::Dot(lossy(whole))),
        b".." => Err(PathError::DotDot(lossy(whole))),
        _ if name.len() > MAX_NAME_LEN => Err(PathError::NameTooLong {
            path: lossy(whole),
            len: name.len(),
        }),
        _ => Ok(()),
    }
}

impl RelPath {
    /// Validates `bytes` as a relative path (see [`PathError`] for everything that is refused).
    pub fn parse(bytes: &[u8]) -> Result<RelPath, PathError> {
        if bytes.is_empty() {
            return Err(PathError::Empty);
        }
        if bytes.len() > MAX_PATH_LEN {
            return Err(PathError::TooLong { len: bytes.len() });
        }
        if bytes[0] == b'/' {
            return Err(PathError::Absolute(lossy(bytes)));
        }
        if bytes.contains(&0) {
            return Err(PathError::Nul(lossy(bytes)));
        }
        for name in bytes.split(|&b| b == b'/') {
            check_name(name, bytes)?;
        }
        Ok(RelPath(bytes.into()))
    }

    /// A one-component path (a directory entry name).
    pub fn from_name(name: &[u8]) -> Result<RelPath, PathError> {
        if name.contains(&b'/') {
            return Err(PathError::Slash(lossy(name)));
        }
        RelPath::parse(name)
    }

    /// `self/name`, validating `name` as a single component.
    pub fn join(&self, name: &[u8]) -> Result<RelPath, PathError> {
        if name.contains(&b'/') {
            return Err(PathError::Slash(lossy(name)));
        }
        if name.contains(&0) {
            return Err(PathError::Nul(lossy(name)));
        }
        check_name(name, name)?;
        let len = self.0.len() + 1 + name.len();
        if len > MAX_PATH_LEN {
            return Err(PathError::TooLong { len });
        }
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(&self.0);
        bytes.push(b'/');
        bytes.extend_from_slice(name);
        Ok(RelPath(bytes.into()))
    }

    /// `parent/name` where `parent` may be the root (`None`).
    pub fn child_of(parent: Option<&RelPath>, name: &[u8]) -> Result<RelPath, PathError> {
        match parent {
            Some(p) => p.join(name),
            None => RelPath::from_name(name),
        }
    }

    /// The raw bytes, components separated by `/`.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The components, first to last; each is a non-empty name without `/` or NUL.
    pub fn components(&self) -> impl DoubleEndedIterator<Item = &[u8]> + '_ {
        self.0.split(|&b| b == b'/')
    }

    /// Number of components.
    pub fn depth(&self) -> usize {
        self.0.iter().filter(|&&b| b == b'/').count() + 1
    }

    /// The directory holding this entry, or `None` when it sits directly in the root.
    pub fn parent(&self) -> Option<RelPath> {
        let cut = self.0.iter().rposition(|&b| b == b'/')?;
        Some(RelPath(self.0[..cut].into()))
    }

    /// The last component.
    pub fn file_name(&self) -> &[u8] {
        match self.0.iter().rposition(|&b| b == b'/') {
            Some(cut) => &self.0[cut + 1..],
            None => &self.0,
        }
    }

    /// True when `self` is `other` or lies beneath it.
    pub fn starts_with(&self, other: &RelPath) -> bool {
        self.0.len() >= other.0.len()
            && self.0[..other.0.len()] == other.0[..]
            && (self.0.len() == other.0.len() || self.0[other.0.len()] == b'/')
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Non-UTF-8 bytes are shown escaped so messages stay printable and unambiguous.
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                if c.is_control() {
                    write!(f, "{}", c.escape_default())?;
                } else {
                    write!(f, "{c}")?;
                }
            }
            for b in chunk.invalid() {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RelPath(\"{self}\")")
    }
}

/// Shows an optional path, the root being `.`.
pub fn display_opt(rel: Option<&RelPath>) -> String {
    rel.map_or_else(|| ".".to_owned(), RelPath::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_table() {
        let long_name = vec![b'a'; MAX_NAME_LEN + 1];
        let long_path: Vec<u8> = std::iter::repeat_n(b"abcdefg/".as_slice(), 600)
            .flatten()
            .copied()
            .chain(*b"x")
            .collect();
        type Check = fn(&PathError) -> bool;
        let cases: Vec<(&[u8], Check)> = vec![
            (b"", |e| matches!(e, PathError::Empty)),
            (b"/etc/passwd", |e| matches!(e, PathError::Absolute(_))),
            (b"/", |e| matches!(e, PathError::Absolute(_))),
            (b"..", |e| matches!(e, PathError::DotDot(_))),
            (b"a/../b", |e| matches!(e, PathError::DotDot(_))),
            (b"a/..", |e| matches!(e, PathError::DotDot(_))),
            (b".", |e| matches!(e, PathError::Dot(_))),
            (b"a/./b", |e| matches!(e, PathError::Dot(_))),
            (b"a//b", |e| matches!(e, PathError::EmptyComponent(_))),
            (b"a/", |e| matches!(e, PathError::EmptyComponent(_))),
            (b"a\0b", |e| matches!(e, PathError::Nul(_))),
            (&long_name, |e| matches!(e, PathError::NameTooLong { .. })),
            (&long_path, |e| matches!(e, PathError::TooLong { .. })),
        ];
        for (input, check) in cases {
            let err = RelPath::parse(input).expect_err("must be rejected");
            assert!(check(&err), "{input:?} gave {err:?}");
        }
    }

    #[test]
    fn accepts_plain_names_including_odd_bytes() {
        for ok in [
            &b"a"[..],
            b"a/b/c",
            b"...",
            b".hidden/..x",
            b"\xff\xfe",
            b"sp ace/x",
        ] {
            let p = RelPath::parse(ok).expect("valid");
            assert_eq!(p.as_bytes(), ok);
        }
    }

    #[test]
    fn parent_name_components_join() {
        let p = RelPath::parse(b"a/bb/ccc").expect("valid");
        assert_eq!(p.file_name(), b"ccc");
        assert_eq!(p.parent().expect("has parent").as_bytes(), b"a/bb");
        assert_eq!(
            p.components().collect::<Vec<_>>(),
            vec![&b"a"[..], b"bb", b"ccc"]
        );
        assert_eq!(p.depth(), 3);
        assert!(RelPath::parse(b"top").expect("valid").parent().is_none());
        let j = p.join(b"d").expect("valid");
        assert_eq!(j.as_bytes(), b"a/bb/ccc/d");
        assert!(p.join(b"..").is_err());
        assert!(p.join(b"x/y").is_err());
        assert!(p.join(b"").is_err());
        assert!(j.starts_with(&p));
        assert!(
            !RelPath::parse(b"a/bbx")
                .expect("valid")
                .starts_with(&RelPath::parse(b"a/b").expect("valid"))
        );
    }

    #[test]
    fn display_escapes_control_and_invalid_bytes() {
        let p = RelPath::parse(b"a\n\xffb").expect("valid");
        assert_eq!(p.to_string(), "a\\n\\xffb");
    }
}
