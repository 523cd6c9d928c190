//! A fan-out's late blocks (refetch capability, docs/protocol.md): after stream 0's Done the
//! receiver may ask for blocks it had left to a fellow destination that failed. Each is sent
//! only if it is a block that can be announced (a full one, or a tail of at least 1 MiB) of a
//! file of this transfer (a path beneath the source root that the walk would have sent) and
//! the source still hashes to what was announced for it, so a receiver learns nothing it was
//! not sent already. A pack of small files (packs capability) likewise: its files' contents
//! back to back must still hash to the pack's announced hash. What the Refetches of one session
//! may cost is bounded (see [`Allowance`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ferry_proto::wire::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite};

use super::effects::{Ctx, Opened, open_beneath, read_block};
use super::state::ReceiverViolation;
use super::{SendError, SenderConfig};
use crate::cas::storable;
use crate::session::framed::{FrameReader, FrameWriter};
use crate::session::scan;
use crate::tree::Filter;
use crate::tree::peer_path::PeerPath;
use crate::wire::{Message, block_len};

/// Most blocks one Refetch may name (what this receiver asks at once).
pub(super) const MAX_REFETCH_BLOCKS: usize = 1024;

/// The blocks one Refetch asks for, checked: `(index, announced hash)`.
#[derive(Debug, PartialEq)]
pub(super) struct Asked {
    pub(super) path: PeerPath,
    pub(super) blocks: Vec<(u64, [u8; 32])>,
}

/// What the Refetches of one session may still cost. An honest receiver asks again only for
/// blocks and packs that were announced to it and that it left to a fellow destination that
/// failed, and for each of them once (each is in one list of orphans, asked once: see
/// `receiver::refetch`). So each block (a path and an index) and each pack (its hash) is sent
/// again at most once per session, and all of them together at most the bytes announced to the
/// receiver: a destination that fails can cost its siblings no more than the data announced to
/// them, never more. Without these bounds a receiver that repeated one Refetch made the sender
/// read and send 480 MiB in 3.5 s, for as long as it liked.
#[derive(Debug, Default)]
pub(super) struct Allowance {
    /// Blocks sent again, by their path's BLAKE3 (16 bytes of it: a path may be 4 KiB long)
    /// and index. Each entry stands for at least 1 MiB within the bytes announced, so the set
    /// stays small beside what it bounds.
    blocks: HashSet<([u8; 16], u64)>,
    /// Packs sent again, by their hash.
    packs: HashSet<[u8; 32]>,
    /// Bytes sent again so far.
    spent: u64,
}

impl Allowance {
    /// Block `index` of `path` is asked for: refused if it was sent again already. Checked
    /// before the block is read.
    pub(super) fn block(&mut self, path: &PeerPath, index: u64) -> Result<(), ReceiverViolation> {
        let mut key = [0u8; 16];
        key.copy_from_slice(&blake3::hash(path.as_bytes()).as_bytes()[..16]);
        if !self.blocks.insert((key, index)) {
            return Err(ReceiverViolation::RefetchRepeated {
                what: format!("block {index} of {path}"),
            });
        }
        Ok(())
    }

    /// The pack of `hash` is asked for: refused if it was sent again already.
    pub(super) fn pack(&mut self, hash: &[u8; 32]) -> Result<(), ReceiverViolation> {
        if !self.packs.insert(*hash) {
            return Err(ReceiverViolation::RefetchRepeated {
                what: format!("the pack {}", crate::digest::hex(hash)),
            });
        }
        Ok(())
    }

    /// `len` more bytes are to be sent again, of the `announced` bytes: refused beyond them.
    pub(super) fn spend(&mut self, len: u64, announced: u64) -> Result<(), ReceiverViolation> {
        let spent = self.spent.saturating_add(len);
        if spent > announced {
            return Err(ReceiverViolation::RefetchBudget { limit: announced });
        }
        self.spent = spent;
        Ok(())
    }
}

fn bad(why: &str) -> ReceiverViolation {
    ReceiverViolation::BadRefetch(why.to_owned())
}

/// A path a Refetch names: a valid tree path the walk would have sent (`only` is the single
/// file a file source sends).
fn sent_path(
    raw: &[u8],
    filter: &Filter,
    only: Option<&[u8]>,
) -> Result<PeerPath, ReceiverViolation> {
    let path = PeerPath::parse(raw).map_err(|e| bad(&e.to_string()))?;
    let bytes = path.as_bytes();
    let left_out = match only {
        Some(name) => bytes != name,
        None => {
            let dirs = bytes
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'/')
                .any(|(i, _)| filter.excludes(&bytes[..i], true));
            dirs || filter.excludes(bytes, false)
        }
    };
    if left_out {
        return Err(bad("its path is not one this transfer sends"));
    }
    Ok(path)
}

/// Checks a pack's Refetch without touching the source: 1 to 1024 paths the walk would have
/// sent, and a 32-byte hash.
pub(super) fn check_pack_refetch(
    p: &pb::RefetchPack,
    filter: &Filter,
    only: Option<&[u8]>,
) -> Result<(Vec<PeerPath>, [u8; 32]), ReceiverViolation> {
    if p.paths.is_empty() || p.paths.len() > crate::session::MAX_OFFER_ENTRIES {
        return Err(bad("its pack names no file or more than 1024"));
    }
    let hash =
        <[u8; 32]>::try_from(p.hash.as_slice()).map_err(|_| bad("a hash is not 32 bytes"))?;
    let paths = p
        .paths
        .iter()
        .map(|raw| sent_path(raw, filter, only))
        .collect::<Result<_, _>>()?;
    Ok((paths, hash))
}

/// Checks a Refetch without touching the source: lists of one length within the bound, a valid
/// tree path the walk would have sent (`only` is the single file a file source sends).
pub(super) fn check_refetch(
    r: &pb::Refetch,
    filter: &Filter,
    only: Option<&[u8]>,
) -> Result<Asked, ReceiverViolation> {
    if r.hashes.len() != r.indexes.len() {
        return Err(bad("its lists differ in length"));
    }
    if r.indexes.len() > MAX_REFETCH_BLOCKS {
        return Err(bad("it names more than 1024 blocks"));
    }
    let path = sent_path(&r.path, filter, only)?;
    let mut blocks = Vec::with_capacity(r.indexes.len());
    for (&index, hash) in r.indexes.iter().zip(&r.hashes) {
        let hash =
            <[u8; 32]>::try_from(hash.as_slice()).map_err(|_| bad("a hash is not 32 bytes"))?;
        blocks.push((index, hash));
    }
    Ok(Asked { path, blocks })
}

/// Answers the receiver's Refetch frames on stream 0 until the empty one.
pub(super) async fn serve<R, W>(
    cfg: &SenderConfig,
    ctx: &Arc<Ctx>,
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
) -> Result<(), SendError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let only = cfg.source_parts().1;
    let mut work = 0;
    let mut allowance = Allowance::default();
    let announced = || ctx.announced_bytes.load(Ordering::Relaxed);
    loop {
        let r = match super::reply::next_reply(reader, ctx, &mut work).await? {
            Message::Refetch(r) => r,
            Message::Error(e) => return Err(SendError::from_peer(e)),
            other => {
                return Err(ReceiverViolation::Unexpected {
                    stream: 0,
                    kind: other.frame_type(),
                    expected: "Refetch",
                }
                .into());
            }
        };
        if let Some(p) = &r.pack {
            let (paths, hash) = check_pack_refetch(p, &cfg.filter, only.as_deref())?;
            allowance.pack(&hash)?;
            let (c, pack_id) = (ctx.clone(), p.pack_id);
            let msg = ctx
                .blocking
                .run(move || super::packs::build_refetched_pack(&c, pack_id, &paths, hash))
                .await??;
            let len = u64::from(match &msg {
                Message::Pack { header, .. } => header.raw_len,
                _ => 0,
            });
            allowance.spend(len, announced())?;
            if let Some(l) = &ctx.limiter {
                l.take(len as usize).await;
            }
            writer.send(&msg).await?;
            writer.flush().await?;
            ctx.progress.add(&ctx.progress.bytes_done, len);
            continue;
        }
        if r.indexes.is_empty() {
            return Ok(());
        }
        let asked = check_refetch(&r, &cfg.filter, only.as_deref())?;
        let path = Arc::new(scan::source_path(&ctx.root, asked.path.as_bytes()));
        let read_err = |source| SendError::Read {
            path: path.to_path_buf(),
            source,
        };
        let (c, rel) = (ctx.clone(), r.path.clone());
        let file = ctx
            .blocking
            .run(move || open_beneath(&c, &rel))
            .await?
            .map_err(read_err)?;
        let size = file.metadata().map_err(read_err)?.len();
        let src = Opened {
            file: Arc::new(file),
            path: path.clone(),
            // These blocks' hashes are in the digest since their announce.
            digest: None,
        };
        let mismatch = |index| SendError::RefetchMismatch {
            path: path.to_path_buf(),
            index,
        };
        for (index, hash) in asked.blocks {
            // Only storable blocks (full ones, long tails) are announced, so only they are owed.
            let len = block_len(size, index);
            if !storable(len as usize) {
                return Err(mismatch(index));
            }
            allowance.block(&asked.path, index)?;
            let (c, job) = (ctx.clone(), src.job(r.file_id, index, len));
            let msg = ctx.blocking.run(move || read_block(&c, job)).await??;
            // What the receiver was promised: the source as announced, or nothing.
            let Message::Block { header, .. } = &msg else {
                return Err(SendError::Channel);
            };
            if header.hash.as_slice() != hash {
                return Err(mismatch(index));
            }
            allowance.spend(len, announced())?;
            if let Some(l) = &ctx.limiter {
                l.take(len as usize).await;
            }
            writer.send(&msg).await?;
            ctx.progress.add(&ctx.progress.bytes_done, len);
        }
        writer.flush().await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refetch(path: &[u8], n: usize) -> pb::Refetch {
        pb::Refetch {
            file_id: 7,
            path: path.to_vec(),
            indexes: (0..n as u64).collect(),
            hashes: (0..n).map(|i| vec![i as u8; 32]).collect(),
            pack: None,
        }
    }

    #[test]
    fn a_refetch_names_full_blocks_of_a_file_the_transfer_sends() {
        let none = Filter::default();
        let asked = check_refetch(&refetch(b"d/a.bin", 3), &none, None).unwrap();
        assert_eq!(asked.path.as_bytes(), b"d/a.bin");
        assert_eq!(asked.blocks[2], (2, [2u8; 32]));
        assert_eq!(asked.blocks.len(), 3);
        check_refetch(&refetch(b"d/a.bin", MAX_REFETCH_BLOCKS), &none, None).unwrap();
    }

    #[test]
    fn a_refetch_cannot_reach_outside_the_tree_or_what_it_leaves_out() {
        let none = Filter::default();
        for path in [
            &b"../etc/passwd"[..],
            b"/etc/passwd",
            b"a/../../b",
            b"",
            b"a//b",
        ] {
            let e = check_refetch(&refetch(path, 1), &none, None).unwrap_err();
            assert!(
                matches!(e, ReceiverViolation::BadRefetch(_)),
                "{path:?}: {e}"
            );
        }
        let rules = Filter::new([(false, "secret/"), (false, "*.key")]).unwrap();
        for path in [&b"secret/model.bin"[..], b"d/secret/x", b"d/tls.key"] {
            let e = check_refetch(&refetch(path, 1), &rules, None).unwrap_err();
            assert!(e.to_string().contains("not one this transfer sends"), "{e}");
        }
        check_refetch(&refetch(b"d/model.bin", 1), &rules, None).unwrap();
        // A single-file source sends that file only.
        check_refetch(&refetch(b"one.bin", 1), &none, Some(b"one.bin")).unwrap();
        assert!(check_refetch(&refetch(b"other.bin", 1), &none, Some(b"one.bin")).is_err());
    }

    #[test]
    fn a_packs_refetch_names_files_the_transfer_sends() {
        let pack = |paths: &[&[u8]], hash_len: usize| pb::RefetchPack {
            pack_id: 3,
            paths: paths.iter().map(|p| p.to_vec()).collect(),
            hash: vec![1; hash_len],
        };
        let rules = Filter::new([(false, "*.key")]).unwrap();
        let (paths, hash) =
            check_pack_refetch(&pack(&[b"d/a.jpg", b"d/b.jpg"], 32), &rules, None).unwrap();
        assert_eq!(paths.len(), 2);
        assert_eq!(hash, [1; 32]);
        for (bad, why) in [
            (
                pack(&[b"d/a.jpg", b"../etc/passwd"], 32),
                "outside the tree",
            ),
            (
                pack(&[b"d/a.jpg", b"tls.key"], 32),
                "left out by the filter",
            ),
            (pack(&[], 32), "no file"),
            (pack(&[b"d/a.jpg"], 31), "a short hash"),
        ] {
            assert!(
                matches!(
                    check_pack_refetch(&bad, &rules, None),
                    Err(ReceiverViolation::BadRefetch(_))
                ),
                "{why}"
            );
        }
        let many: Vec<Vec<u8>> = (0..1025).map(|i| format!("f{i}").into_bytes()).collect();
        let too_many = pb::RefetchPack {
            pack_id: 3,
            paths: many,
            hash: vec![1; 32],
        };
        assert!(check_pack_refetch(&too_many, &rules, None).is_err());
    }

    #[test]
    fn each_block_and_pack_is_refetched_once_and_all_within_what_was_announced() {
        const MIB: u64 = 1 << 20;
        let mut a = Allowance::default();
        let path = |p: &[u8]| PeerPath::parse(p).unwrap();
        a.block(&path(b"d/a.bin"), 0).unwrap();
        a.block(&path(b"d/a.bin"), 1).unwrap();
        a.block(&path(b"d/b.bin"), 0).unwrap();
        let again = a.block(&path(b"d/a.bin"), 1).unwrap_err();
        assert!(
            matches!(&again, ReceiverViolation::RefetchRepeated { what } if what == "block 1 of d/a.bin"),
            "{again}"
        );
        a.pack(&[7; 32]).unwrap();
        a.pack(&[8; 32]).unwrap();
        assert!(matches!(
            a.pack(&[7; 32]),
            Err(ReceiverViolation::RefetchRepeated { .. })
        ));
        // 12 MiB announced: three 4 MiB blocks fit, a fourth does not, nor does one more byte.
        for _ in 0..3 {
            a.spend(4 * MIB, 12 * MIB).unwrap();
        }
        let over = a.spend(1, 12 * MIB).unwrap_err();
        assert_eq!(over, ReceiverViolation::RefetchBudget { limit: 12 * MIB });
        assert!(over.to_string().contains("12582912 bytes"), "{over}");
        // Nothing announced: nothing may be sent again.
        assert!(Allowance::default().spend(MIB, 0).is_err());
        assert!(Allowance::default().spend(u64::MAX, u64::MAX - 1).is_err());
    }

    #[test]
    fn a_malformed_refetch_is_refused() {
        let none = Filter::default();
        let mut r = refetch(b"a", 2);
        r.hashes.pop();
        assert!(check_refetch(&r, &none, None).is_err());
        let mut r = refetch(b"a", 1);
        r.hashes[0] = vec![0; 31];
        assert!(check_refetch(&r, &none, None).is_err());
        assert!(check_refetch(&refetch(b"a", MAX_REFETCH_BLOCKS + 1), &none, None).is_err());
    }
}
