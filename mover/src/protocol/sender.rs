//! The sender's protocol rules, apart from any I/O: per stream, which replies the receiver owes
//! (a Want for each Offer, a NeedBlocks for each BlockAnnounce or ResumeCheck, in order), what
//! each reply asks for, and how a large file's wanted blocks split between the wire, the
//! receiver's block store and the blocks it holds from an earlier run. The effects read and hash
//! the source; the driver moves frames. Nothing here touches a file or a socket.

use std::collections::VecDeque;

use ferry_proto::wire::v1 as pb;

use super::SMALL_FILE_MAX;
use super::wire::{Bitmap, BlockSet, BlockSetError, FrameType, block_count, block_len};
use crate::cas::announceable;

/// The small files of one Offer announced as a pack: what is read again if the receiver asks
/// for the pack's bytes.
#[derive(Debug)]
pub(crate) struct PackSpec {
    /// The receiver's id of the pack (its first file's).
    pub(crate) pack_id: u64,
    pub(crate) files: Vec<pb::Entry>,
    pub(crate) hash: [u8; 32],
    pub(crate) len: u64,
}

/// How the receiver broke the protocol, as this sender saw it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiverViolation {
    #[error("stream {stream}: unexpected {kind:?} frame from receiver (expected {expected})")]
    Unexpected {
        stream: u32,
        kind: FrameType,
        expected: &'static str,
    },
    #[error("receiver answered offer {got}, expected {expected}")]
    WantMismatch { got: u64, expected: u64 },
    #[error("answer to offer {offer_id} has {got} entries, the offer had {offered}")]
    WantLength {
        offer_id: u64,
        got: usize,
        offered: usize,
    },
    #[error("answer to offer {offer_id} for {path}: {source}")]
    NeedSet {
        offer_id: u64,
        path: String,
        #[source]
        source: BlockSetError,
    },
    #[error("the receiver asked for the data of {0} in a dry run")]
    DataInDryRun(String),
    #[error("NeedBlocks for file id {got}, expected {expected}")]
    NeedBlocksFor { got: u64, expected: u64 },
    #[error("refused a Refetch: {0}")]
    BadRefetch(String),
    #[error(
        "refused a Refetch: it asks again for {what}, which this session sent it already (a \
         block or pack is refetched at most once per session)"
    )]
    RefetchRepeated { what: String },
    #[error(
        "refused a Refetch: the receiver's refetches would come to more than the {limit} bytes \
         this session announced to it (a receiver refetches only announced blocks and packs)"
    )]
    RefetchBudget { limit: u64 },
}

/// What a Want asks of one offered file.
#[derive(Debug, Clone, PartialEq)]
pub enum Wanted {
    /// The receiver has it: only the digest reads it.
    Unchanged(pb::Entry),
    /// Whole, in a Batch, under the receiver's id.
    Small { file_id: u64, entry: pb::Entry },
    /// These blocks, under the receiver's id; the rest it holds from an earlier run.
    Large {
        file_id: u64,
        entry: pb::Entry,
        need: BlockSet,
    },
}

/// Blocks of one file announced in one BlockAnnounce or ResumeCheck, waiting for the
/// receiver's NeedBlocks; `file` is what the effects need to read them.
#[derive(Debug)]
pub struct Announced<A> {
    pub file_id: u64,
    pub size: u64,
    pub indexes: Vec<u64>,
    pub file: A,
}

/// A NeedBlocks, matched with its announce.
#[derive(Debug)]
pub struct Needed<A> {
    pub announced: Announced<A>,
    /// Blocks to send over the wire after all.
    pub send: Vec<u64>,
    /// Bytes the receiver took from its store or kept from an earlier run.
    pub taken_bytes: u64,
}

/// The replies one stream's receiver owes, in the order it owes them.
#[derive(Debug)]
pub struct Replies<A> {
    stream: u32,
    dry_run: bool,
    offers: VecDeque<(u64, Vec<pb::Entry>)>,
    announced: VecDeque<Announced<A>>,
}

impl<A> Replies<A> {
    pub fn new(stream: u32, dry_run: bool) -> Self {
        Self {
            stream,
            dry_run,
            offers: VecDeque::new(),
            announced: VecDeque::new(),
        }
    }

    /// An Offer was (or is about to be) sent: a Want is owed.
    pub fn offered(&mut self, offer_id: u64, entries: Vec<pb::Entry>) {
        self.offers.push_back((offer_id, entries));
    }

    /// A BlockAnnounce or ResumeCheck was sent: a NeedBlocks is owed.
    pub fn announced(&mut self, a: Announced<A>) {
        self.announced.push_back(a);
    }

    /// Whether a Want is owed.
    pub fn owes_want(&self) -> bool {
        !self.offers.is_empty()
    }

    /// Whether nothing is owed.
    pub fn settled(&self) -> bool {
        self.offers.is_empty() && self.announced.is_empty()
    }

    /// A frame other than a reply this stream expects.
    pub fn unexpected(&self, kind: FrameType) -> ReceiverViolation {
        ReceiverViolation::Unexpected {
            stream: self.stream,
            kind,
            expected: match (self.owes_want(), self.announced.is_empty()) {
                (true, true) => "Want",
                (false, false) => "NeedBlocks",
                _ => "Want or NeedBlocks",
            },
        }
    }

    /// A Want: it answers the oldest offer, one answer per entry. Returns what it asks of each
    /// offered file (other kinds need nothing more).
    pub fn on_want(&mut self, want: pb::Want) -> Result<Vec<Wanted>, ReceiverViolation> {
        let Some((offer_id, entries)) = self.offers.pop_front() else {
            return Err(self.unexpected(FrameType::Want));
        };
        if want.offer_id != offer_id {
            return Err(ReceiverViolation::WantMismatch {
                got: want.offer_id,
                expected: offer_id,
            });
        }
        if want.entries.len() != entries.len() {
            return Err(ReceiverViolation::WantLength {
                offer_id,
                got: want.entries.len(),
                offered: entries.len(),
            });
        }
        let mut wanted = Vec::new();
        for (entry, w) in entries.into_iter().zip(want.entries) {
            if entry.kind != pb::EntryKind::File as i32 {
                continue;
            }
            if w.skip {
                wanted.push(Wanted::Unchanged(entry));
                continue;
            }
            if self.dry_run {
                return Err(ReceiverViolation::DataInDryRun(
                    String::from_utf8_lossy(&entry.path).into_owned(),
                ));
            }
            if entry.size <= SMALL_FILE_MAX {
                wanted.push(Wanted::Small {
                    file_id: w.file_id,
                    entry,
                });
                continue;
            }
            let need = BlockSet::from_want(&w.need_blocks, &w.need_ranges, block_count(entry.size))
                .map_err(|source| ReceiverViolation::NeedSet {
                    offer_id,
                    path: String::from_utf8_lossy(&entry.path).into_owned(),
                    source,
                })?;
            wanted.push(Wanted::Large {
                file_id: w.file_id,
                entry,
                need,
            });
        }
        Ok(wanted)
    }

    /// A NeedBlocks: it answers the oldest announce, a bit per announced block (set: send it).
    pub fn on_need_blocks(&mut self, nb: &pb::NeedBlocks) -> Result<Needed<A>, ReceiverViolation> {
        let Some(a) = self.announced.pop_front() else {
            return Err(self.unexpected(FrameType::NeedBlocks));
        };
        if nb.file_id != a.file_id {
            return Err(ReceiverViolation::NeedBlocksFor {
                got: nb.file_id,
                expected: a.file_id,
            });
        }
        let mut send = Vec::new();
        let mut taken_bytes = 0;
        for (i, &index) in a.indexes.iter().enumerate() {
            if Bitmap::get(&nb.need_blocks, i as u64) {
                send.push(index);
            } else {
                taken_bytes += block_len(a.size, index);
            }
        }
        Ok(Needed {
            announced: a,
            send,
            taken_bytes,
        })
    }
}

/// Where a large file's blocks come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LargePlan {
    /// Read and sent as Block frames.
    pub send: BlockSet,
    /// Blocks announced to the receiver's block store first (hash and proof each): full blocks,
    /// and with `tails` a last block the store may keep.
    pub announce: BlockSet,
    /// Blocks the receiver holds from an earlier run: confirmed by a ResumeCheck when it
    /// resumes, otherwise only read for the digest.
    pub held: BlockSet,
}

/// Splits a large file's blocks: what the receiver needs goes over the wire, or, with its block
/// store (`dedup`), every full block is announced first, and with `tails` a last block of at
/// least [`MIN_STORED_BLOCK`](crate::cas::MIN_STORED_BLOCK) as well; the rest it holds.
pub fn plan_large(size: u64, need: &BlockSet, dedup: bool, tails: bool) -> LargePlan {
    let count = block_count(size);
    let (send, announce) = if dedup {
        // Only storable blocks are announced; another last block always travels.
        let (mut announce, mut send) = (need.clone(), BlockSet::new());
        let last = count.saturating_sub(1);
        if !announceable(block_len(size, last), tails) && announce.remove(last) {
            send.insert(last);
        }
        (send, announce)
    } else {
        (need.clone(), BlockSet::new())
    };
    LargePlan {
        send,
        announce,
        held: need.complement(count),
    }
}

#[cfg(test)]
mod tests;
