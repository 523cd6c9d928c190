//! Validation of relative paths received from a peer: the receiver, not the sender, decides
//! where bytes land, so a name is only ever a list of plain components below the root.

/// Longest accepted path and component (bytes).
pub const MAX_PATH: usize = 4096;
pub const MAX_COMPONENT: usize = 255;
/// Top-level name the receiver keeps for its own resume state; peers may not touch it.
pub const STAGING_DIR: &str = ".ferry-staging";

#[derive(Debug, thiserror::Error)]
#[error("invalid path {shown:?} from peer: {why}")]
pub struct RelPathError {
    shown: String,
    why: &'static str,
}

/// A validated peer path: '/'-separated, non-empty, no '.', '..', empty or over-long
/// components, no NUL, not absolute and not inside the receiver's staging directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerPath(String);

impl PeerPath {
    pub fn parse(s: &str) -> Result<Self, RelPathError> {
        let err = |why| RelPathError {
            shown: s.chars().take(200).collect(),
            why,
        };
        if s.is_empty() {
            return Err(err("empty"));
        }
        if s.len() > MAX_PATH {
            return Err(err("longer than 4096 bytes"));
        }
        if s.starts_with('/') {
            return Err(err("absolute"));
        }
        if s.contains('\0') {
            return Err(err("contains NUL"));
        }
        for (i, c) in s.split('/').enumerate() {
            match c {
                "" => return Err(err("empty component")),
                "." | ".." => return Err(err("'.' or '..' component")),
                _ if c.len() > MAX_COMPONENT => return Err(err("component longer than 255 bytes")),
                STAGING_DIR if i == 0 => return Err(err("names the receiver's staging directory")),
                _ => {}
            }
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
