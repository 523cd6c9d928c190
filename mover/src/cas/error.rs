//! Errors of the block store. Each names what failed and on which path; the cause is kept.

use std::io;
use std::path::PathBuf;

use super::hash::BlockHash;

#[derive(Debug, thiserror::Error)]
pub enum CasError {
    #[error("failed to {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a ferry block store (bad marker file: {reason})")]
    NotAStore { path: PathBuf, reason: String },
    #[error("refusing to store block {expected}: its content hashes to {actual}")]
    HashMismatch {
        expected: BlockHash,
        actual: BlockHash,
    },
    #[error("refusing to store a block of {len} bytes (the limit is {limit})")]
    BlockTooLarge { len: usize, limit: usize },
    #[error("failed to write block {hash} into the destination at offset {offset}")]
    Materialize {
        hash: BlockHash,
        offset: u64,
        #[source]
        source: io::Error,
    },
}

impl CasError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            what,
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = CasError> = std::result::Result<T, E>;
