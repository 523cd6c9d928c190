//! Paths received from a peer: the engine's [`RelPath`] rules (plain components below the root;
//! the receiver, not the sender, decides where bytes land), UTF-8 as the wire carries them, and
//! never the receiver's own staging directory.

use crate::tree::RelPath;

/// Top-level name the receiver keeps for its own resume state; peers may not touch it.
pub const STAGING_DIR: &str = ".ferry-staging";

#[derive(Debug, thiserror::Error)]
#[error("invalid path {shown:?} from peer: {why}")]
pub struct RelPathError {
    shown: String,
    why: String,
}

/// A validated peer path: a valid [`RelPath`] (non-empty, at most 4096 bytes, components of at
/// most 255 bytes, no '.', '..', empty component, NUL or leading '/') that is not inside the
/// receiver's staging directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerPath(String);

impl PeerPath {
    pub fn parse(s: &str) -> Result<Self, RelPathError> {
        let err = |why: String| RelPathError {
            shown: s.chars().take(200).collect(),
            why,
        };
        RelPath::parse(s.as_bytes()).map_err(|e| err(e.to_string()))?;
        if s.split('/').next() == Some(STAGING_DIR) {
            return Err(err("names the receiver's staging directory".into()));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// (parent directory components, leaf name)
    pub fn split_parent(&self) -> (Option<&str>, &str) {
        match self.0.rsplit_once('/') {
            Some((p, l)) => (Some(p), l),
            None => (None, &self.0),
        }
    }
}

impl std::fmt::Display for PeerPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "..",
            "a/../../x",
            "a/./b",
            "a//b",
            "a/",
            "./a",
            "a\0b",
            ".ferry-staging/x",
            ".ferry-staging",
        ] {
            assert!(PeerPath::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(PeerPath::parse(&"x".repeat(300)).is_err());
        assert!(PeerPath::parse(&"a/".repeat(3000)).is_err());
    }

    #[test]
    fn plain_names_are_accepted() {
        for good in [
            "a",
            "a/b/c",
            "with space/ü",
            "x/.ferry-staging",
            "..a",
            "a..",
        ] {
            assert_eq!(PeerPath::parse(good).unwrap().as_str(), good);
        }
        let p = PeerPath::parse("a/b/c").unwrap();
        assert_eq!(p.split_parent(), (Some("a/b"), "c"));
    }
}
