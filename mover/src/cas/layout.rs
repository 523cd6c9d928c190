//! Where things live inside a store directory. Everything is on one filesystem so a temp file can
//! be renamed to its final name atomically.
//!
//! ```text
//! DIR/FERRY-CAS               marker: format version and the recorded cap
//! DIR/blocks/ab/cd/abcd…      one file per block, named by its full hex hash
//! DIR/tmp/*.tmp               blocks being written (flock'd by their writer)
//! DIR/leases/*.lease          pins of active transfers (flock'd by their holder)
//! DIR/lock                    flock: shared while pinning, exclusive while evicting
//! DIR/gc.lock                 flock: one garbage collection at a time
//! DIR/usage                   8-byte approximate byte count, corrected by every gc scan
//! ```

use std::path::{Path, PathBuf};

use super::hash::BlockHash;

#[derive(Clone, Debug)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn marker(&self) -> PathBuf {
        self.root.join("FERRY-CAS")
    }
    pub fn blocks(&self) -> PathBuf {
        self.root.join("blocks")
    }
    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }
    pub fn leases(&self) -> PathBuf {
        self.root.join("leases")
    }
    pub fn lock(&self) -> PathBuf {
        self.root.join("lock")
    }
    pub fn gc_lock(&self) -> PathBuf {
        self.root.join("gc.lock")
    }
    pub fn usage(&self) -> PathBuf {
        self.root.join("usage")
    }
    /// Two levels of 256 shards keep directories small up to hundreds of millions of blocks.
    pub fn shard_dir(&self, hash: &BlockHash) -> PathBuf {
        let hex = hash.to_hex();
        self.blocks().join(&hex[0..2]).join(&hex[2..4])
    }
    pub fn block(&self, hash: &BlockHash) -> PathBuf {
        self.shard_dir(hash).join(hash.to_hex())
    }
}
