//! A fan-out's small files (packs capability, docs/protocol.md): when a receiver wants every
//! small file of an Offer whole and they come to 1 to 4 MiB, they are announced as one pack, a
//! block of their contents back to back, so that one destination takes them from the source
//! and the others from its node service, as they do with the blocks of large files. The pack is
//! read once to announce it (hash, possession secret, each file's hash for the digest) and again
//! only if the receiver asks for it.

use std::sync::Arc;

use ferry_proto::wire::v1 as pb;

use super::SendError;
use super::effects::{Ctx, SourceDirs, read_small_into};
use super::shared::{FileKey, PackKey, PackRead, SharedReads};
use super::state::PackSpec;
use crate::cas::dedup::DedupSender;
use crate::cas::pop::secret_of;
use crate::cas::{BlockHash, storable};
use crate::digest;
use crate::session::SMALL_FILE_MAX;
use crate::session::scan;
use crate::tree::peer_path::PeerPath;
use crate::wire::{BLOCK_SIZE, Message, codec};

/// Whether the small files a Want asks for make a pack: only when the receiver asked for every
/// small file of the Offer (`all_small_wanted`), so that every destination of a fan-out, each
/// asking for the same files, announces the same pack, and when their bytes are what a block
/// store keeps (1 to 4 MiB).
pub(super) fn makes_pack(small: &[(u64, pb::Entry)], all_small_wanted: bool) -> bool {
    let len: u64 = small.iter().map(|(_, e)| e.size).sum();
    all_small_wanted
        && !small.is_empty()
        && small.len() <= crate::session::MAX_OFFER_ENTRIES
        && len <= BLOCK_SIZE as u64
        && storable(len as usize)
}

/// Reads the pack's files (in order) into `buf`, their contents back to back, calling
/// `each(entry, content)` per file; a file that changed size since the walk is an error.
fn read_files<'a>(
    ctx: &Ctx,
    files: impl IntoIterator<Item = &'a pb::Entry>,
    buf: &mut Vec<u8>,
    mut each: impl FnMut(&pb::Entry, &[u8]),
) -> Result<(), SendError> {
    let mut dirs = SourceDirs::of(ctx);
    for e in files {
        let rerr = |source| SendError::Read {
            path: scan::source_path(&ctx.root, &e.path),
            source,
        };
        if e.size > SMALL_FILE_MAX || buf.len() as u64 + e.size > BLOCK_SIZE as u64 {
            return Err(SendError::Changed(scan::source_path(&ctx.root, &e.path)));
        }
        let f = dirs.open(&e.path).map_err(rerr)?;
        let start = buf.len();
        if !read_small_into(&f, e.size, buf).map_err(rerr)? {
            return Err(SendError::Changed(scan::source_path(&ctx.root, &e.path)));
        }
        each(e, &buf[start..]);
    }
    Ok(())
}

/// Reads the wanted small files `small` of one Offer and builds their PackAnnounce: the pack's
/// hash and the proof of possession for this stream. With `shared`, a pack another session of
/// this sender read already (the same files, unchanged) is not read again. Each file's hash
/// goes into the digest here, as a Batch would have put it.
pub(super) fn build_pack_announce(
    ctx: &Ctx,
    dedup: &DedupSender,
    shared: Option<&SharedReads>,
    small: Vec<(u64, pb::Entry)>,
) -> Result<(Message, Arc<PackSpec>), SendError> {
    let read = || {
        let mut buf = ctx.batch_buffers.take(0);
        let mut files = Vec::with_capacity(small.len());
        let r = read_files(ctx, small.iter().map(|(_, e)| e), &mut buf, |_, content| {
            files.push(*blake3::hash(content).as_bytes());
        });
        let read = r.map(|()| PackRead {
            hash: *blake3::hash(&buf).as_bytes(),
            secret: secret_of(&buf),
            files,
        });
        ctx.batch_buffers.give_back(buf);
        read
    };
    let pack = match shared {
        Some(shared) => {
            let key = pack_key(ctx, small.iter().map(|(_, e)| e))?;
            shared.pack(key, small.len(), read)?
        }
        None => Arc::new(read()?),
    };
    if !ctx.content_in_scan {
        for ((_, e), hash) in small.iter().zip(&pack.files) {
            ctx.file_digested(e, &digest::content_hash_single(e.size, hash));
        }
    }
    let announced = dedup.announce_known(0, BlockHash::from_bytes(pack.hash), &pack.secret);
    let len = small.iter().map(|(_, e)| e.size).sum();
    let (file_ids, files): (Vec<u64>, Vec<pb::Entry>) = small.into_iter().unzip();
    let spec = PackSpec {
        pack_id: file_ids[0],
        files,
        hash: pack.hash,
        len,
    };
    let msg = Message::PackAnnounce(pb::PackAnnounce {
        file_ids,
        hash: pack.hash.to_vec(),
        proof: announced.proof.0.to_vec(),
    });
    Ok((msg, Arc::new(spec)))
}

/// What the pack's files are now (each one's [`FileKey`]), for the sessions to share its read:
/// a file rewritten since another session read it makes another key.
fn pack_key<'a>(
    ctx: &Ctx,
    files: impl IntoIterator<Item = &'a pb::Entry>,
) -> Result<PackKey, SendError> {
    let mut dirs = SourceDirs::of(ctx);
    let mut keys = Vec::new();
    for e in files {
        let rerr = |source| SendError::Read {
            path: scan::source_path(&ctx.root, &e.path),
            source,
        };
        let f = dirs.open(&e.path).map_err(rerr)?;
        keys.push(FileKey::of(&f).map_err(rerr)?);
    }
    Ok(PackKey::of(&keys))
}

/// The Pack frame of `spec`, read from the source again: only if it still hashes to what was
/// announced (a destination's store keeps it under that name for the others).
pub(super) fn build_pack(ctx: &Ctx, spec: &PackSpec) -> Result<Message, SendError> {
    let buffers = &ctx.batch_buffers;
    let mut buf = buffers.take(0);
    read_files(ctx, &spec.files, &mut buf, |_, _| {})?;
    if buf.len() as u64 != spec.len || BlockHash::of(&buf).as_bytes() != &spec.hash {
        let first = spec.files.first().map(|e| e.path.as_slice()).unwrap_or(b"");
        return Err(SendError::PackChanged {
            first: scan::source_path(&ctx.root, first),
            files: spec.files.len(),
        });
    }
    let (codec_id, data) = match ctx.policy.compress(&buf) {
        Some((codec_id, packed)) => {
            buffers.give_back(buf);
            (codec_id, bytes::Bytes::from(packed))
        }
        None => (codec::RAW, buffers.freeze(buf)),
    };
    Ok(Message::Pack {
        header: pb::PackHeader {
            pack_id: spec.pack_id,
            raw_len: spec.len as u32,
            codec: codec_id,
            hash: spec.hash.to_vec(),
        },
        data,
    })
}

/// The Pack frame a Refetch asks for: the files at `paths` (checked to be paths this transfer
/// sends), in that order, whose contents back to back must hash to `hash` as announced.
pub(super) fn build_refetched_pack(
    ctx: &Ctx,
    pack_id: u64,
    paths: &[PeerPath],
    hash: [u8; 32],
) -> Result<Message, SendError> {
    let mut dirs = SourceDirs::of(ctx);
    let mut files = Vec::with_capacity(paths.len());
    for p in paths {
        let rerr = |source| SendError::Read {
            path: scan::source_path(&ctx.root, p.as_bytes()),
            source,
        };
        let f = dirs.open(p.as_bytes()).map_err(rerr)?;
        let size = f.metadata().map_err(rerr)?.len();
        files.push(pb::Entry {
            path: p.as_bytes().to_vec(),
            size,
            ..Default::default()
        });
    }
    let len = files.iter().map(|e| e.size).sum();
    build_pack(
        ctx,
        &PackSpec {
            pack_id,
            files,
            hash,
            len,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(sizes: &[u64]) -> Vec<(u64, pb::Entry)> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let e = pb::Entry {
                    path: format!("f{i}").into_bytes(),
                    kind: pb::EntryKind::File as i32,
                    size,
                    ..Default::default()
                };
                (i as u64 + 1, e)
            })
            .collect()
    }

    #[test]
    fn an_offers_small_files_make_a_pack_when_all_are_wanted_and_a_store_keeps_them() {
        const MIB: u64 = 1 << 20;
        assert!(makes_pack(&wanted(&[MIB, MIB / 2, 0, MIB]), true));
        assert!(makes_pack(&wanted(&[MIB; 4]), true), "exactly 4 MiB");
        assert!(
            !makes_pack(&wanted(&[MIB; 4]), false),
            "the receiver holds another small file of the offer"
        );
        assert!(
            !makes_pack(&wanted(&[MIB / 2, MIB / 4]), true),
            "under 1 MiB"
        );
        assert!(!makes_pack(&wanted(&[MIB; 5]), true), "over 4 MiB");
        assert!(!makes_pack(&[], true));
    }
}
