//! A fan-out's small files (packs capability, docs/protocol.md): the small files of one Offer
//! come as one content-addressed pack of 1 to 4 MiB, so that like a block it leaves the source
//! once and reaches the other destinations through the owner's node service. Whatever brings a
//! pack's bytes (this node's store, a fellow destination's store, the wire), they are checked
//! against the announced hash, then cut into the pack's files, each hashed for the digest and
//! written like a file of a Batch.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use ferry_proto::wire::v1 as pb;

use super::ReceiveError;
use super::effects::{FileMeta, Session, write_small, write_small_files};
use super::state::{ClaimedPack, MAX_PACKED_WAITING, PackedFile, SenderViolation};
use crate::cas::BlockHash;
use crate::cas::dedup::AnnouncedBlock;
use crate::cas::pop::PopKey;
use crate::cas::store::BlockSink;
use crate::session::compress;
use crate::tree::peer_path::PeerPath;
use crate::wire::{Bitmap, FrameType, codec};

/// One PackAnnounce: claim the pack's files, take the pack from this node's store when it
/// holds it (proof of possession as for blocks), else leave it to the fellow destination that
/// owns it, else ask the sender for it. The answer is a NeedBlocks for the pack with one bit.
pub(super) fn handle_pack_announce(
    sh: &Arc<Session>,
    key: &PopKey,
    a: pb::PackAnnounce,
) -> Result<pb::NeedBlocks, ReceiveError> {
    let Some(dedup) = &sh.dedup else {
        return Err(SenderViolation::NotNegotiated(FrameType::PackAnnounce).into());
    };
    if let Some(msg) = sh.fetches.as_ref().and_then(|f| f.failure()) {
        return Err(ReceiveError::PeerBlocks(msg));
    }
    let pack = sh.state()?.claim_pack(&a)?;
    let pack_id = pack.pack_id;
    let held = PackBuffer::default();
    let needed = dedup.materialize_announced(key, &held, std::slice::from_ref(&pack.announced))?;
    let from_store = match held.take() {
        Some(bytes) if !needed.first().copied().unwrap_or(true) => Some(bytes),
        _ => None,
    };
    let on_wire = if let Some(bytes) = from_store {
        let files = sh.state()?.take_pack(pack_id)?;
        write_pack(sh, &pack, files, &bytes)?;
        count_taken(sh, pack.len);
        false
    } else if let Some(owner) = leave_to(sh, &pack)? {
        let f = sh
            .fetches
            .as_ref()
            .ok_or(ReceiveError::Internal("no fetches"))?;
        let announced = pack.announced;
        let sink = Arc::new(PeerPackSink {
            sh: sh.clone(),
            pack,
        });
        f.start(key, vec![(owner, announced)], sink);
        false
    } else {
        sh.state()?.pack_on_wire(pack_id)?;
        true
    };
    Ok(answer(pack_id, on_wire))
}

/// The fellow destination to take `pack` from, if one owns it and may be waited for.
fn leave_to(sh: &Session, pack: &ClaimedPack) -> Result<Option<usize>, ReceiveError> {
    let Some(f) = &sh.fetches else {
        return Ok(None);
    };
    let Some(owner) = f.pack_owner(pack.paths[0].as_bytes()) else {
        return Ok(None);
    };
    if sh.state()?.packed_files() > MAX_PACKED_WAITING || f.admit(1) == 0 {
        return Ok(None);
    }
    Ok(Some(owner))
}

fn answer(pack_id: u64, needed: bool) -> pb::NeedBlocks {
    let mut bitmap = Bitmap::with_len(1);
    if needed {
        bitmap.set(0);
    }
    pb::NeedBlocks {
        file_id: pack_id,
        need_blocks: bitmap.into_bytes(),
    }
}

/// A pack taken from a store counts as a store hit, live (the summary counts it through the
/// store's own counters).
fn count_taken(sh: &Session, len: u64) {
    sh.progress.add(&sh.progress.dedup_blocks, 1);
    sh.progress.add(&sh.progress.dedup_bytes, len);
}

/// A Pack frame (the sender's answer to a pack this receiver asked for, or to its Refetch):
/// decoded into exactly the announced length, checked against the announced hash, added to
/// the node's store for the fellow destinations, and written.
pub(super) fn handle_pack(
    sh: &Session,
    header: &pb::PackHeader,
    data: &Bytes,
) -> Result<(), ReceiveError> {
    let files = sh.state()?.claim_pack_data(header)?;
    let first = files.first().map(|f| f.path.clone());
    let name = || first.as_ref().map(ToString::to_string).unwrap_or_default();
    let len = header.raw_len as usize;
    let bytes: Bytes = if header.codec == codec::RAW && data.len() == len {
        data.clone()
    } else {
        let mut decoded = Vec::with_capacity(len);
        compress::decode(header.codec, data, len, sh.caps, &mut decoded).map_err(|source| {
            ReceiveError::Codec {
                path: name(),
                index: 0,
                source,
            }
        })?;
        decoded.into()
    };
    let hash = BlockHash::of(&bytes);
    if hash.as_bytes().as_slice() != header.hash.as_slice() {
        return Err(ReceiveError::PackHashMismatch {
            path: name(),
            files: files.len(),
        });
    }
    if let Some(d) = &sh.dedup
        && let Err(e) = d.insert_received(&hash, bytes.clone())
    {
        // The store is a cache: failing to add to it never fails the transfer.
        tracing::warn!(error = %e, "could not add a received pack to the block store");
    }
    write_files(sh, files, &bytes)
}

/// Bytes a store handed over for `pack` (verified against its hash): cut into its files and
/// written. Bytes of another length than the files' sizes add up to mean the sender announced a
/// hash that is not its pack's.
fn write_pack(
    sh: &Session,
    pack: &ClaimedPack,
    files: Vec<PackedFile<FileMeta>>,
    bytes: &[u8],
) -> Result<(), ReceiveError> {
    if bytes.len() as u64 != pack.len {
        return Err(SenderViolation::PackMismatch {
            id: pack.pack_id,
            got: bytes.len() as u64,
            len: pack.len,
        }
        .into());
    }
    write_files(sh, files, bytes)
}

/// Writes each file of a pack from its part of `bytes` (the files' contents back to back),
/// hashing it on the way for the digest.
fn write_files(
    sh: &Session,
    files: Vec<PackedFile<FileMeta>>,
    bytes: &[u8],
) -> Result<(), ReceiveError> {
    let mut parts = Vec::with_capacity(files.len());
    let mut off = 0usize;
    for f in &files {
        let end = off + f.size as usize;
        let content = bytes
            .get(off..end)
            .ok_or(ReceiveError::Internal("a pack shorter than its files"))?;
        parts.push((&f.file, content));
        off = end;
    }
    write_small_files(sh, &parts, |part| {
        for (meta, content) in part {
            let hash = blake3::hash(content);
            write_small(sh, meta, content, hash.as_bytes())?;
        }
        Ok(())
    })
}

/// Where a store's copy of a pack lands: in memory (at most 4 MiB), to be cut into files.
#[derive(Default)]
struct PackBuffer(Mutex<Option<Bytes>>);

impl PackBuffer {
    fn take(&self) -> Option<Bytes> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl BlockSink for PackBuffer {
    fn write_block(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        if offset != 0 {
            return Err(std::io::Error::other("a pack is one block, at offset 0"));
        }
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Bytes::copy_from_slice(data));
        Ok(())
    }

    fn parallel_reads(&self) -> bool {
        false
    }
}

/// Where a pack taken from a fan-out peer goes: its files, and this node's store.
struct PeerPackSink {
    sh: Arc<Session>,
    pack: ClaimedPack,
}

impl crate::node::swarm::FetchSink for PeerPackSink {
    fn deliver(&self, _: &AnnouncedBlock, block: Bytes) -> Result<(), String> {
        let (sh, pack) = (&self.sh, &self.pack);
        let fail = |e: &dyn std::error::Error| {
            format!(
                "the pack from {} on: {}",
                pack.paths[0],
                crate::session::error_chain(e)
            )
        };
        let files = sh
            .state()
            .and_then(|mut s| Ok(s.take_pack(pack.pack_id)?))
            .map_err(|e| fail(&e))?;
        write_pack(sh, pack, files, &block).map_err(|e| fail(&e))?;
        if let Some(d) = &sh.dedup
            && let Err(e) = d.insert_received(&pack.announced.hash, block)
        {
            tracing::warn!(error = %e, "could not add a fan-out pack to the block store");
        }
        count_taken(sh, pack.len);
        Ok(())
    }

    fn file_id(&self) -> u64 {
        self.pack.pack_id
    }

    fn path(&self) -> &[u8] {
        self.pack.paths[0].as_bytes()
    }

    fn pack_paths(&self) -> Option<&[PeerPath]> {
        Some(&self.pack.paths)
    }
}
