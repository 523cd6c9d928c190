//! A receiver session's block store: one it opened itself (`--cas`), or its node's service
//! (`--block-service`). The receiver chooses; both answer the same questions.

use crate::cas::BlockHash;
use crate::cas::Result;
use crate::cas::dedup::{AnnouncedBlock, DedupCounters, DedupReceiver};
use crate::cas::pop::PopKey;
use crate::cas::store::BlockSink;
use crate::node::client::NodeDedup;

/// A receiver session's block store: one it opened itself, or its node's service.
pub enum BlockDedup {
    Local(DedupReceiver),
    Node(NodeDedup),
}

impl BlockDedup {
    /// See [`DedupReceiver::materialize_announced`].
    pub fn materialize_announced(
        &self,
        key: &PopKey,
        dst: &(impl BlockSink + Sync + ?Sized),
        announced: &[AnnouncedBlock],
    ) -> Result<Vec<bool>> {
        match self {
            Self::Local(d) => d.materialize_announced(key, dst, announced),
            Self::Node(d) => d.materialize_announced(key, dst, announced),
        }
    }

    /// See [`DedupReceiver::insert_received`]; a node service's queue keeps `bytes` (a handle,
    /// not a copy) until the block is put.
    pub fn insert_received(&self, hash: &BlockHash, bytes: bytes::Bytes) -> Result<()> {
        match self {
            Self::Local(d) => d.insert_received(hash, &bytes),
            Self::Node(d) => d.insert_received(hash, bytes),
        }
    }

    pub fn counters(&self) -> DedupCounters {
        match self {
            Self::Local(d) => d.counters(),
            Self::Node(d) => d.counters(),
        }
    }

    /// The session is done: blocks still on their way to the store get there (a local store has
    /// them already). From a blocking thread.
    pub fn finish(&self) {
        if let Self::Node(d) = self {
            d.finish();
        }
    }
}
