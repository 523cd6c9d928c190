//! How metadata is applied on the destination: which bits, which owner, via which handle.

use std::os::fd::BorrowedFd;

use rustix::fs::{
    AtFlags, Gid, Mode, Timespec, Timestamps, Uid, chownat, fchmod, fchown, futimens, utimensat,
};
use rustix::io::Errno;

use super::meta::{Meta, PERM_BITS, SPECIAL_BITS};

/// Destination-side policy for metadata, fixed when the destination is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaPolicy {
    /// Apply uid/gid (only meaningful, and only attempted, when running as root).
    pub preserve_owner: bool,
    /// Apply setuid/setgid/sticky bits. Off for anything a network peer sends.
    pub allow_special_bits: bool,
    /// The process umask, read once; lets us skip fchmod when create() already gave the right mode.
    pub umask: u32,
    pub euid: u32,
    pub egid: u32,
}

impl MetaPolicy {
    /// Reads the process identity and umask. `preserve_owner` is true only for root.
    pub fn current(allow_special_bits: bool) -> MetaPolicy {
        let umask = read_umask();
        let euid = rustix::process::geteuid().as_raw();
        MetaPolicy {
            preserve_owner: euid == 0,
            allow_special_bits,
            umask,
            euid,
            egid: rustix::process::getegid().as_raw(),
        }
    }

    /// The mode bits this policy lets `meta` have.
    pub fn wanted_mode(&self, meta: &Meta) -> u32 {
        let mask = if self.allow_special_bits {
            PERM_BITS | SPECIAL_BITS
        } else {
            PERM_BITS
        };
        meta.mode & mask
    }

    /// What `open(O_CREAT, perm)` produces under the umask.
    pub fn created_mode(&self, perm: u32) -> u32 {
        perm & PERM_BITS & !self.umask
    }

    fn wants_chown(&self, meta: &Meta) -> bool {
        self.preserve_owner && (meta.uid != self.euid || meta.gid != self.egid)
    }

    /// Applies owner, mode and times to an open file or directory. `created_perm` is the mode the
    /// object was created with (`None` when unknown), so a redundant fchmod can be skipped.
    pub fn apply_fd(
        &self,
        fd: BorrowedFd<'_>,
        meta: &Meta,
        created_perm: Option<u32>,
    ) -> Result<(), MetaError> {
        let chowned = self.wants_chown(meta);
        if chowned {
            fchown(
                fd,
                Some(Uid::from_raw(meta.uid)),
                Some(Gid::from_raw(meta.gid)),
            )
            .map_err(|e| MetaError::new("change owner of", e))?;
        }
        let wanted = self.wanted_mode(meta);
        // chown clears setuid/setgid, so special bits always need the chmod after it.
        let needs_chmod = match created_perm {
            Some(perm) => {
                self.created_mode(perm) != wanted || (chowned && wanted & SPECIAL_BITS != 0)
            }
            None => true,
        };
        if needs_chmod {
            fchmod(fd, Mode::from_raw_mode(wanted))
                .map_err(|e| MetaError::new("change mode of", e))?;
        }
        futimens(fd, &timestamps(meta)).map_err(|e| MetaError::new("set times of", e))
    }

    /// Owner and times of a symlink (links have no mode of their own on Linux).
    pub fn apply_link(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        meta: &Meta,
    ) -> Result<(), MetaError> {
        if self.wants_chown(meta) {
            chownat(
                dir,
                name,
                Some(Uid::from_raw(meta.uid)),
                Some(Gid::from_raw(meta.gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| MetaError::new("change owner of", e))?;
        }
        utimensat(dir, name, &timestamps(meta), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| MetaError::new("set times of", e))
    }
}

/// The process umask from /proc (race-free); where /proc is missing, by setting and restoring it.
fn read_umask() -> u32 {
    let from_proc = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        });
    from_proc.unwrap_or_else(|| {
        let old = rustix::process::umask(Mode::from_raw_mode(0o022));
        rustix::process::umask(old);
        old.as_raw_mode()
    })
}

/// Failure to apply one piece of metadata.
#[derive(Debug, thiserror::Error)]
#[error("failed to {what}")]
pub struct MetaError {
    what: String,
    #[source]
    source: std::io::Error,
}

impl MetaError {
    /// The system's error number (EPERM: not the entry's owner).
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    fn new(what: &str, e: Errno) -> MetaError {
        MetaError {
            what: format!("{what} the entry"),
            source: e.into(),
        }
    }
}

/// The (atime, mtime) pair of `meta` for futimens/utimensat.
pub fn timestamps(meta: &Meta) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: meta.atime_sec,
            tv_nsec: i64::from(meta.atime_nsec),
        },
        last_modification: Timespec {
            tv_sec: meta.mtime_sec,
            tv_nsec: i64::from(meta.mtime_nsec),
        },
    }
}
