//! Makes a node's store directory usable by the unprivileged node service: creates it, gives it
//! to the service's uid and gid with mode 0700, and refuses a symlink anywhere on the way (a
//! hostPath the kubelet mounted is followed by it, but what this step creates or chowns must be
//! the directory itself). Run as root in the DaemonSet's init container with only CHOWN and
//! FOWNER; idempotent.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use anyhow::{Context, bail};

/// Prepares `dir` (created when missing) for `uid:gid`; returns what it changed, for the log.
pub fn prepare(dir: &Path, uid: u32, gid: u32) -> anyhow::Result<Vec<String>> {
    let mut changed = Vec::new();
    match fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => {
            bail!(
                "{} is a symlink: refusing to prepare a store through it",
                dir.display()
            )
        }
        Ok(m) if !m.is_dir() => bail!("{} exists and is not a directory", dir.display()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(dir)
                .with_context(|| format!("failed to create {}", dir.display()))?;
            changed.push(format!("created {}", dir.display()));
        }
        Err(e) => return Err(e).with_context(|| format!("failed to stat {}", dir.display())),
    }
    let m = fs::symlink_metadata(dir)?;
    if (m.uid(), m.gid(), m.mode() & 0o7777) == (uid, gid, 0o700) {
        // Prepared before; since then only the service (this uid) wrote inside.
        return Ok(changed);
    }
    // What an earlier root-run receiver may have left inside is handed over too, before the
    // directory itself (once it is the service's with mode 0700, root without DAC_OVERRIDE can
    // no longer list it). The store's layout is shallow (blocks/xx/, tmp/, leases/).
    let mut handed = 0usize;
    for entry in walk(dir)? {
        let e = fs::symlink_metadata(&entry)?;
        if (e.uid(), e.gid()) != (uid, gid) {
            std::os::unix::fs::lchown(&entry, Some(uid), Some(gid))
                .with_context(|| format!("failed to give {} to {uid}:{gid}", entry.display()))?;
            handed += 1;
        }
    }
    if handed > 0 {
        changed.push(format!("{handed} entries inside given to {uid}:{gid}"));
    }
    if (m.uid(), m.gid()) != (uid, gid) {
        std::os::unix::fs::lchown(dir, Some(uid), Some(gid))
            .with_context(|| format!("failed to give {} to {uid}:{gid}", dir.display()))?;
        changed.push(format!("owner {}:{} -> {uid}:{gid}", m.uid(), m.gid()));
    }
    if m.mode() & 0o7777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("failed to set the mode of {}", dir.display()))?;
        changed.push(format!("mode {:o} -> 700", m.mode() & 0o7777));
    }
    Ok(changed)
}

/// Everything beneath `dir` (never following a symlink).
fn walk(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).with_context(|| format!("failed to list {}", d.display()))? {
            let e = e?;
            if e.file_type()?.is_dir() {
                todo.push(e.path());
            }
            out.push(e.path());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_sets_the_mode_and_is_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/cas");
        let (uid, gid) = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        let first = prepare(&dir, uid, gid).unwrap();
        assert!(first.iter().any(|c| c.starts_with("created")), "{first:?}");
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
        assert!(prepare(&dir, uid, gid).unwrap().is_empty());
    }

    #[test]
    fn a_symlink_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("real")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real"), tmp.path().join("link")).unwrap();
        let err = prepare(&tmp.path().join("link"), 0, 0).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
    }
}
