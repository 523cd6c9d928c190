//! File metadata as ferry carries it between trees.

use rustix::fs::{FileType, Stat};

/// What kind of filesystem object an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// FIFOs, sockets and device nodes: reported and skipped, never recreated.
    Special,
}

/// Metadata of one entry: what a copy preserves plus what it needs to detect hard links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Meta {
    pub kind: Kind,
    /// Permission bits and the setuid/setgid/sticky bits (`st_mode & 0o7777`). Whether the
    /// special bits are applied is the destination's policy ([`crate::tree::DestOptions`]).
    pub mode: u32,
    pub size: u64,
    pub mtime_sec: i64,
    /// Nanoseconds, always below 1e9.
    pub mtime_nsec: u32,
    pub atime_sec: i64,
    pub atime_nsec: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub dev: u64,
    pub ino: u64,
    /// Allocated 512-byte blocks; fewer than `size / 512` hints that the file has holes.
    pub blocks: u64,
}

/// Permission bits a destination may always apply.
pub const PERM_BITS: u32 = 0o777;
/// setuid, setgid and sticky.
pub const SPECIAL_BITS: u32 = 0o7000;

impl Meta {
    /// Converts an `lstat`/`fstat` result.
    pub fn from_stat(st: &Stat) -> Meta {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Special,
        };
        Meta {
            kind,
            mode: st.st_mode & 0o7777,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime_sec: st.st_mtime,
            mtime_nsec: clamp_nsec(st.st_mtime_nsec as i64),
            atime_sec: st.st_atime,
            atime_nsec: clamp_nsec(st.st_atime_nsec as i64),
            uid: st.st_uid,
            gid: st.st_gid,
            #[allow(clippy::useless_conversion)] // u64 on x86_64, u32 on some other targets
            nlink: u64::from(st.st_nlink),
            dev: st.st_dev,
            ino: st.st_ino,
            blocks: u64::try_from(st.st_blocks).unwrap_or(0),
        }
    }

    /// A minimal description for entries built from peer data (no device/inode identity).
    pub fn new(kind: Kind, mode: u32, size: u64, mtime_sec: i64, mtime_nsec: u32) -> Meta {
        Meta {
            kind,
            mode: mode & 0o7777,
            size,
            mtime_sec,
            mtime_nsec: mtime_nsec.min(999_999_999),
            atime_sec: mtime_sec,
            atime_nsec: mtime_nsec.min(999_999_999),
            uid: 0,
            gid: 0,
            nlink: 1,
            dev: 0,
            ino: 0,
            blocks: size.div_ceil(512),
        }
    }

    /// Same size and same mtime to the nanosecond: the incremental "unchanged" rule.
    pub fn same_size_and_mtime(&self, other: &Meta) -> bool {
        self.size == other.size
            && self.mtime_sec == other.mtime_sec
            && self.mtime_nsec == other.mtime_nsec
    }

    /// True when the allocation is clearly smaller than the size, so holes are worth preserving.
    pub fn looks_sparse(&self) -> bool {
        self.kind == Kind::File && self.blocks.saturating_mul(512) < self.size
    }
}

fn clamp_nsec(ns: i64) -> u32 {
    u32::try_from(ns.clamp(0, 999_999_999)).unwrap_or(0)
}
