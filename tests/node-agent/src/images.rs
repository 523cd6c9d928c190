//! Image → local binary. No container runtime exists here, so an image stands for a binary built in
//! this workspace: the repository's last path component names a file in the bin dir
//! (`registry/x/ferry-mover:v1` → `<bin-dir>/ferry-mover`), unless an explicit override matches first.
//! An image with no binary behind it runs its `command` from the host's userland (like `busybox`).

use std::path::{Path, PathBuf};

/// The repository part of an image reference: no tag, no digest.
pub fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    // A ':' after the last '/' starts the tag; one before it belongs to a registry port.
    match no_digest.rfind(':') {
        Some(colon) if !no_digest[colon..].contains('/') => &no_digest[..colon],
        _ => no_digest,
    }
}

/// The binary an image maps to, if any.
pub fn resolve(image: &str, overrides: &[(String, PathBuf)], bin_dir: &Path) -> Option<PathBuf> {
    let repo = repository(image);
    if let Some((_, path)) = overrides
        .iter()
        .find(|(suffix, _)| repo.ends_with(suffix.as_str()))
    {
        return Some(path.clone());
    }
    let name = repo.rsplit('/').next().filter(|n| !n.is_empty())?;
    let candidate = bin_dir.join(name);
    candidate.is_file().then_some(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_strips_tag_and_digest_but_not_registry_port() {
        assert_eq!(
            repository("ghcr.io/ferry-dev/ferry-mover:v1"),
            "ghcr.io/ferry-dev/ferry-mover"
        );
        assert_eq!(
            repository("localhost:5000/ferry-mover"),
            "localhost:5000/ferry-mover"
        );
        assert_eq!(repository("ferry-mover@sha256:abc"), "ferry-mover");
        assert_eq!(repository("busybox"), "busybox");
    }

    #[test]
    fn resolve_prefers_overrides_then_bin_dir_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ferry-mover"), b"").unwrap();
        assert_eq!(
            resolve("x.io/ferry/ferry-mover:dev", &[], dir.path()),
            Some(dir.path().join("ferry-mover"))
        );
        assert_eq!(resolve("busybox:1", &[], dir.path()), None);
        let over = vec![("ferry-mover".to_string(), PathBuf::from("/opt/m"))];
        assert_eq!(
            resolve("ferry-mover", &over, dir.path()),
            Some(PathBuf::from("/opt/m"))
        );
    }
}
