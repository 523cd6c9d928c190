//! The receiver's protocol rules, apart from any I/O: which frames a stream may send when, which
//! files are in flight under which ids, which blocks of each large file are still needed, held
//! from an earlier run or claimed, and when a file is complete. The effects (filesystem work)
//! and the driver (the async loop over streams) ask this state before they touch anything and
//! tell it what they did; it answers with what to do next or with the [`SenderViolation`] the sender
//! committed. Nothing here reads a clock, a socket or a file, so every rule is unit-tested and
//! fuzzed on its own (`mover/fuzz/fuzz_targets/receiver_state.rs`).
//!
//! Memory is bounded by constants, whatever the sender does: at most [`MAX_IN_FLIGHT`] files,
//! [`MAX_LARGE_IN_FLIGHT`] of them large, each with at most [`MAX_FILE_RANGES`] ranges of block
//! bookkeeping.

use std::collections::{HashMap, HashSet};

use ferry_proto::wire::v1 as pb;

use super::wire::{BLOCK_SIZE, BlockSet, FrameType, block_count, block_len};
use super::{MAX_OFFER_ENTRIES, MAX_STREAMS, OFFER_WINDOW, SMALL_FILE_MAX};
use crate::cas::dedup::AnnouncedBlock;
use crate::cas::pop::Proof;
use crate::cas::{BlockHash, MIN_STORED_BLOCK, announceable, storable};
use crate::tree::peer_path::PeerPath;

/// Most files of packs that wait for a fellow destination of a fan-out (their Offer answered,
/// their bytes to come from another node's store). The receiver leaves no more packs to its
/// fellows beyond it (they come from the source), so a lagging fellow never fills
/// [`MAX_IN_FLIGHT`].
pub const MAX_PACKED_WAITING: usize = 64 * 1024;
/// Most files the receiver tracks as "offered, not yet complete" at once. It must exceed what an
/// honest sender can have outstanding: on each stream, the offers of its window plus the one
/// whose data is being written and the one being read, each up to a full offer; and in a
/// fan-out the packs left to fellows. About 35 MiB of bookkeeping at the cap, so a hostile
/// sender still cannot grow it without bound.
pub const MAX_IN_FLIGHT: usize =
    MAX_STREAMS as usize * (OFFER_WINDOW + 2) * MAX_OFFER_ENTRIES + MAX_PACKED_WAITING;
/// Most large files (cut into blocks) in flight per session. An honest sender ends each Offer
/// after its first large file, so it has at most one per Offer it may have outstanding: this
/// bounds the staging files (two descriptors each) a peer can make the receiver hold.
pub const MAX_LARGE_IN_FLIGHT: usize = MAX_STREAMS as usize * (OFFER_WINDOW + 2);
/// Most blocks one BlockAnnounce or ResumeCheck may list (256 GiB of a file; the sender splits
/// larger files).
pub const MAX_ANNOUNCE_BLOCKS: usize = 65536;
/// Largest file size accepted from a peer (a file offset is an `off_t`); the destination's
/// filesystem may allow less, and then refuses the file with its own error.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Most ranges one large file's block bookkeeping may split into. Blocks of an honest sender
/// arrive nearly in order (a shared queue feeds every stream), so a few ranges suffice; this
/// bounds what a sender that scatters its blocks can make the receiver hold.
pub const MAX_FILE_RANGES: usize = 4096;
/// Most names in one `--delete` directory listing.
pub const MAX_LISTING_NAMES: usize = 10_000_000;
/// Longest symlink target accepted (PATH_MAX less its NUL).
pub const MAX_LINK_TARGET: usize = 4096;

/// How the sender broke the protocol. Each names what it saw; all are the peer's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SenderViolation {
    #[error("stream {stream}: {kind:?} frame not allowed {when}")]
    OutOfOrder {
        stream: u32,
        kind: FrameType,
        when: &'static str,
    },
    #[error(
        "streams of one session disagree: stream {position} of {count} announced index {index} of {announced}"
    )]
    StreamsDisagree {
        position: u32,
        count: u32,
        index: u32,
        announced: u32,
    },
    #[error("{0:?} frame without the capability that allows it")]
    NotNegotiated(FrameType),
    #[error("offer with {0} entries (max {MAX_OFFER_ENTRIES})")]
    OfferTooLarge(usize),
    #[error("entry {0} has no kind")]
    NoKind(String),
    #[error("invalid symlink target for {0}")]
    LinkTarget(String),
    #[error("{path}: declared size {size} exceeds the largest file offset {MAX_FILE_SIZE}")]
    FileTooLarge { path: String, size: u64 },
    #[error("duplicate entry {0} in one session")]
    Duplicate(String),
    #[error("too many files in flight (at most {MAX_IN_FLIGHT} per session)")]
    TooManyFiles,
    #[error("too many large files in flight (at most {MAX_LARGE_IN_FLIGHT} per session)")]
    TooManyLarge,
    #[error("{frame} for unknown file id {id}")]
    UnknownFile { frame: &'static str, id: u64 },
    #[error("{frame} for {what} file id {id}")]
    WrongFileKind {
        frame: &'static str,
        what: &'static str,
        id: u64,
    },
    #[error("batch entry runs past the end of its frame")]
    BatchOverrun,
    #[error("batch frame has trailing bytes")]
    BatchTrailing,
    #[error("{path}: batch carries {got} bytes, the offer said {offered}")]
    BatchLength {
        path: String,
        got: u64,
        offered: u64,
    },
    #[error("{path}: block index {index} past the last block {last}")]
    BlockIndex { path: String, index: u64, last: u64 },
    #[error("{path}: block {index} is {got} bytes, expected {expected}")]
    BlockLength {
        path: String,
        index: u64,
        got: u64,
        expected: u64,
    },
    #[error("{path}: block {index} was not requested or was sent twice")]
    NotRequested { path: String, index: u64 },
    #[error("{path}: block {index} is not one the Refetch named, or not with its announced hash")]
    NotRefetched { path: String, index: u64 },
    #[error("{path}: blocks arrive too scattered (more than {MAX_FILE_RANGES} gaps)")]
    Scattered { path: String },
    #[error("{frame} lists differ in length")]
    ListLengths { frame: &'static str },
    #[error("{frame} lists {count} blocks (max {MAX_ANNOUNCE_BLOCKS})")]
    TooManyBlocks { frame: &'static str, count: usize },
    #[error(
        "{path}: announced block {index} is not a block a store keeps (a full block, or in a \
         fan-out a last block of at least 1 MiB)"
    )]
    NotAnnounceable { path: String, index: u64 },
    #[error("{path}: announced block {index} has a malformed hash or proof")]
    MalformedAnnounce { path: String, index: u64 },
    #[error("PackAnnounce names {0} files (a pack holds 1 to {MAX_OFFER_ENTRIES})")]
    PackFiles(usize),
    #[error(
        "PackAnnounce of {len} bytes (a pack holds {MIN_STORED_BLOCK} to {BLOCK_SIZE} bytes of files)"
    )]
    PackSize { len: u64 },
    #[error("PackAnnounce from {path} on has a malformed hash or proof")]
    MalformedPack { path: String },
    #[error("Pack frame for pack id {0}, which is not announced or not asked for")]
    UnknownPack(u64),
    #[error(
        "Pack frame for pack id {id} is not the pack announced (length {got}, announced {len})"
    )]
    PackMismatch { id: u64, got: u64, len: u64 },
    #[error("{path}: ResumeCheck names block {index}, which is not held or was checked")]
    NotHeld { path: String, index: u64 },
    #[error("{path}: malformed hash in ResumeCheck")]
    MalformedResumeHash { path: String },
    #[error("DirDone without a directory")]
    DirDoneWithoutDir,
    #[error("directory listing too long")]
    ListingTooLong,
    #[error("invalid name {0:?} in a directory listing")]
    ListingName(String),
    #[error("filter rules: {0}")]
    FilterRules(String),
    #[error(
        "{path}: extended attribute name {name:?} is not a user.* name (user.<name>, at most 255 bytes)"
    )]
    XattrName { path: String, name: String },
    #[error("{path}: {count} extended attributes (at most {max})")]
    XattrCount {
        path: String,
        count: usize,
        max: usize,
    },
    #[error("{path}: {total} bytes of extended attributes (at most {max})")]
    XattrSize {
        path: String,
        total: u64,
        max: usize,
    },
    #[error("more than {0} bytes of extended attributes in flight")]
    XattrsInFlight(u64),
    #[error("the sender finished but {count} file(s) are incomplete, e.g. {example}")]
    Incomplete { count: usize, example: String },
}

/// Where a stream is in the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Offers and their data.
    Data,
    /// Stream 0 after every stream said Done: hard links, directory metadata, Finish.
    Closing,
    /// Nothing more may come.
    Ended,
}

/// What the driver does with a frame a stream may send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Answer with a Want.
    Offer,
    /// Block or Batch: verify and write (the stream's data worker).
    Data,
    /// Answer with a NeedBlocks (block store or resume).
    Announce,
    /// Answer with a NeedBlocks for the pack (packs capability).
    PackAnnounce,
    ResumeCheck,
    DirDone,
    /// The stream's data is all sent: stream 0 moves on to closing, the others end.
    Done,
    /// Stream 0: the tree is complete; answer with the Summary.
    Finish,
    /// Keepalive or Busy: nothing to do.
    Alive,
    /// The sender failed and said why.
    PeerError,
}

/// The frames one stream may send, in order. Owned by its stream's task.
#[derive(Debug)]
pub struct StreamRules {
    index: u32,
    phase: Phase,
    dedup: bool,
    resume: bool,
    packs: bool,
}

impl StreamRules {
    /// `dedup`: this stream's Welcome offered the block store; `resume`: the resume capability
    /// was negotiated.
    pub fn new(index: u32, dedup: bool, resume: bool) -> Self {
        Self {
            index,
            phase: Phase::Data,
            dedup,
            resume,
            packs: false,
        }
    }

    /// With the packs capability negotiated (a fan-out): PackAnnounce and Pack frames may
    /// come on a stream that offered the block store.
    pub fn with_packs(mut self, packs: bool) -> Self {
        self.packs = packs;
        self
    }

    /// Whether `frame` may come now, and what to do with it.
    pub fn route(&mut self, frame: FrameType) -> Result<Route, SenderViolation> {
        let out_of_order = |when| SenderViolation::OutOfOrder {
            stream: self.index,
            kind: frame,
            when,
        };
        let route = match (self.phase, frame) {
            (Phase::Ended, _) => return Err(out_of_order("after the stream ended")),
            (_, FrameType::Keepalive | FrameType::Busy) => Route::Alive,
            (_, FrameType::Error) => Route::PeerError,
            (_, FrameType::Offer) => Route::Offer,
            (Phase::Data, FrameType::Block | FrameType::Batch) => Route::Data,
            (Phase::Data, FrameType::BlockAnnounce) if self.dedup => Route::Announce,
            (Phase::Data, FrameType::PackAnnounce) if self.dedup && self.packs => {
                Route::PackAnnounce
            }
            (Phase::Data, FrameType::Pack) if self.dedup && self.packs => Route::Data,
            (Phase::Data, FrameType::PackAnnounce | FrameType::Pack) => {
                return Err(SenderViolation::NotNegotiated(frame));
            }
            (Phase::Data, FrameType::ResumeCheck) if self.resume => Route::ResumeCheck,
            (Phase::Data, FrameType::BlockAnnounce | FrameType::ResumeCheck) => {
                return Err(SenderViolation::NotNegotiated(frame));
            }
            (Phase::Data, FrameType::Done) => {
                self.phase = if self.index == 0 {
                    Phase::Closing
                } else {
                    Phase::Ended
                };
                Route::Done
            }
            (Phase::Closing, FrameType::DirDone) => Route::DirDone,
            (Phase::Closing, FrameType::Finish) => {
                self.phase = Phase::Ended;
                Route::Finish
            }
            (Phase::Data, _) => return Err(out_of_order("while data flows")),
            (Phase::Closing, _) => return Err(out_of_order("after Done")),
        };
        Ok(route)
    }
}

/// One file the receiver asked for, under its id.
#[derive(Debug)]
struct InFlight<S, L> {
    path: PeerPath,
    size: u64,
    content: Content<S, L>,
}

/// How a file's content comes, with what the effects attached to it (metadata to apply,
/// staging handles).
#[derive(Debug)]
enum Content<S, L> {
    /// Whole, in a Batch.
    Small(S),
    /// Whole, in a pack (see [`Pack`]).
    Packed(S),
    /// In blocks, each tracked.
    Large(L, Blocks),
}

/// The small files of one PackAnnounce, until their bytes come: from the wire (a Pack frame,
/// once the receiver asked for it), or from a block store.
#[derive(Debug)]
struct Pack {
    files: Vec<u64>,
    hash: [u8; 32],
    len: u64,
    on_wire: bool,
}

/// A PackAnnounce, claimed: what the receiver looks up in block stores, and what a Refetch
/// names if the pack must come from the sender after all.
#[derive(Debug, Clone)]
pub struct ClaimedPack {
    pub pack_id: u64,
    pub announced: AnnouncedBlock,
    pub len: u64,
    /// The pack's files, in its order.
    pub paths: Vec<PeerPath>,
}

/// One file of a pack whose bytes came: `size` bytes of the pack, after the files before it.
#[derive(Debug)]
pub struct PackedFile<S> {
    pub file: S,
    pub path: PeerPath,
    pub size: u64,
}

/// Which blocks of a large file are where. A few ranges, whatever the file's size.
#[derive(Debug)]
struct Blocks {
    count: u64,
    /// Requested and not yet claimed by any stream.
    need: BlockSet,
    /// Left in the staging file by an earlier run, not yet confirmed by the sender's
    /// ResumeCheck (until then they are not part of the file).
    held: BlockSet,
    /// Not yet verified and written (needed, held, or claimed and in progress).
    remaining: u64,
}

/// A small file of a Batch frame, claimed: its bytes are `data[range]` of the frame.
#[derive(Debug)]
pub struct ClaimedSmall<F> {
    pub file: F,
    pub path: PeerPath,
    pub range: std::ops::Range<usize>,
    pub entry: pb::BatchFile,
}

/// A block claimed for writing.
#[derive(Debug)]
pub struct ClaimedBlock<F> {
    pub file: F,
    pub path: PeerPath,
    /// The file's size (block geometry) and the block's length.
    pub size: u64,
    pub len: u64,
}

/// A ResumeCheck's blocks, claimed for re-reading.
#[derive(Debug)]
pub struct ClaimedResume<F> {
    pub file: F,
    pub path: PeerPath,
    pub size: u64,
    pub hashes: Vec<[u8; 32]>,
}

/// Everything in flight in one session, shared by its streams (behind one lock).
#[derive(Debug)]
pub struct ReceiverState<S, L> {
    files: HashMap<u64, InFlight<S, L>>,
    /// Paths of `files`: a path is in flight at most once.
    paths: HashSet<PeerPath>,
    large: usize,
    /// Packs announced whose bytes have not come, by id; their files are `Packed` in `files`.
    packs: HashMap<u64, Pack>,
    /// Files in `packs`.
    packed: usize,
    next_id: u64,
}

impl<S, L> Default for ReceiverState<S, L> {
    fn default() -> Self {
        Self {
            files: HashMap::new(),
            paths: HashSet::new(),
            large: 0,
            packs: HashMap::new(),
            packed: 0,
            next_id: 1,
        }
    }
}

impl<S, L: Clone> ReceiverState<S, L> {
    /// Files in flight (asked for, not yet complete).
    pub fn in_flight(&self) -> usize {
        self.files.len()
    }

    /// Files of packs whose bytes have not come yet.
    pub fn packed_files(&self) -> usize {
        self.packed
    }

    /// An Offer's size.
    pub fn check_offer(entries: usize) -> Result<(), SenderViolation> {
        if entries > MAX_OFFER_ENTRIES {
            return Err(SenderViolation::OfferTooLarge(entries));
        }
        Ok(())
    }

    /// Whether a file of `size` at `path` may be taken into flight: asked before the
    /// destination is looked at, so a sender cannot make the receiver stat or hash without
    /// bound.
    pub fn check_file(&self, path: &PeerPath, size: u64) -> Result<(), SenderViolation> {
        if size > MAX_FILE_SIZE {
            return Err(SenderViolation::FileTooLarge {
                path: path.to_string(),
                size,
            });
        }
        if self.paths.contains(path) {
            return Err(SenderViolation::Duplicate(path.to_string()));
        }
        if self.files.len() >= MAX_IN_FLIGHT {
            return Err(SenderViolation::TooManyFiles);
        }
        if size > SMALL_FILE_MAX && self.large >= MAX_LARGE_IN_FLIGHT {
            return Err(SenderViolation::TooManyLarge);
        }
        Ok(())
    }

    /// Asks for a small file (whole, in a Batch); returns its id.
    pub fn want_small(
        &mut self,
        path: PeerPath,
        size: u64,
        file: S,
    ) -> Result<u64, SenderViolation> {
        self.check_file(&path, size)?;
        Ok(self.register(path, size, Content::Small(file)))
    }

    /// Asks for a large file of which an earlier run left `held` blocks (to be confirmed by
    /// ResumeCheck); returns its id and the blocks to request.
    pub fn want_large(
        &mut self,
        path: PeerPath,
        size: u64,
        held: BlockSet,
        file: L,
    ) -> Result<(u64, BlockSet), SenderViolation> {
        self.check_file(&path, size)?;
        let count = block_count(size);
        let need = held.complement(count);
        let blocks = Blocks {
            count,
            need: need.clone(),
            held,
            remaining: count,
        };
        check_scatter(&path, &blocks)?;
        self.large += 1;
        Ok((
            self.register(path, size, Content::Large(file, blocks)),
            need,
        ))
    }

    fn register(&mut self, path: PeerPath, size: u64, content: Content<S, L>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.paths.insert(path.clone());
        self.files.insert(
            id,
            InFlight {
                path,
                size,
                content,
            },
        );
        id
    }

    /// A Batch frame of `data_len` bytes: each file must be a small file in flight, carry the
    /// size its offer declared, and the chunks must tile the frame exactly. On success every
    /// file is claimed (a second Batch naming one is refused); on failure nothing is.
    pub fn claim_batch(
        &mut self,
        entries: Vec<pb::BatchFile>,
        data_len: usize,
    ) -> Result<Vec<ClaimedSmall<S>>, SenderViolation> {
        let mut off = 0usize;
        let mut seen = HashSet::with_capacity(entries.len());
        for bf in &entries {
            let end = off
                .checked_add(bf.stored_len as usize)
                .filter(|e| *e <= data_len)
                .ok_or(SenderViolation::BatchOverrun)?;
            off = end;
            let f = self.small(bf.file_id)?;
            if u64::from(bf.raw_len) != f.size {
                return Err(SenderViolation::BatchLength {
                    path: f.path.to_string(),
                    got: u64::from(bf.raw_len),
                    offered: f.size,
                });
            }
            if !seen.insert(bf.file_id) {
                return Err(SenderViolation::UnknownFile {
                    frame: "batch",
                    id: bf.file_id,
                });
            }
        }
        if off != data_len {
            return Err(SenderViolation::BatchTrailing);
        }
        let mut off = 0usize;
        let mut claimed = Vec::with_capacity(entries.len());
        for entry in entries {
            let Some(InFlight {
                path,
                content: Content::Small(file),
                ..
            }) = self.files.remove(&entry.file_id)
            else {
                unreachable!("checked above");
            };
            let range = off..off + entry.stored_len as usize;
            off = range.end;
            // No longer in flight: its path may come again (it then finds the file and skips),
            // so a long session is not bounded by MAX_IN_FLIGHT files in all.
            self.paths.remove(&path);
            claimed.push(ClaimedSmall {
                file,
                path,
                range,
                entry,
            });
        }
        Ok(claimed)
    }

    fn small(&self, id: u64) -> Result<&InFlight<S, L>, SenderViolation> {
        match self.files.get(&id) {
            Some(
                f @ InFlight {
                    content: Content::Small(_),
                    ..
                },
            ) => Ok(f),
            Some(InFlight {
                content: Content::Packed(_),
                ..
            }) => Err(SenderViolation::WrongFileKind {
                frame: "batch",
                what: "packed",
                id,
            }),
            Some(_) => Err(SenderViolation::WrongFileKind {
                frame: "batch",
                what: "large",
                id,
            }),
            None => Err(SenderViolation::UnknownFile { frame: "batch", id }),
        }
    }

    /// The large file in flight under `id` (path, size, payload, blocks), for a `frame` that may
    /// only name one.
    fn large(
        &mut self,
        id: u64,
        frame: &'static str,
    ) -> Result<(&PeerPath, u64, &L, &mut Blocks), SenderViolation> {
        match self.files.get_mut(&id) {
            Some(InFlight {
                path,
                size,
                content: Content::Large(file, blocks),
            }) => Ok((path, *size, file, blocks)),
            Some(_) => Err(SenderViolation::WrongFileKind {
                frame,
                what: "small",
                id,
            }),
            None => Err(SenderViolation::UnknownFile { frame, id }),
        }
    }

    /// A Block frame: a requested block of a large file in flight, of the file's length at that
    /// index, not claimed before (a duplicate on another stream is refused).
    pub fn claim_block(&mut self, h: &pb::BlockHeader) -> Result<ClaimedBlock<L>, SenderViolation> {
        let (path, size, file, b) = self.large(h.file_id, "block")?;
        if h.index >= b.count {
            return Err(SenderViolation::BlockIndex {
                path: path.to_string(),
                index: h.index,
                last: b.count - 1,
            });
        }
        let expected = block_len(size, h.index);
        if u64::from(h.raw_len) != expected {
            return Err(SenderViolation::BlockLength {
                path: path.to_string(),
                index: h.index,
                got: u64::from(h.raw_len),
                expected,
            });
        }
        claim_all(path, b, &[h.index])?;
        Ok(ClaimedBlock {
            file: file.clone(),
            path: path.clone(),
            size,
            len: expected,
        })
    }

    /// A BlockAnnounce: full blocks of a large file in flight (and with `tails` its last block
    /// when the store may keep it), each requested and not claimed, with a 32-byte hash and
    /// proof each. Claims them all (as Block frames would).
    pub fn claim_announce(
        &mut self,
        a: &pb::BlockAnnounce,
        tails: bool,
    ) -> Result<(ClaimedBlock<L>, Vec<AnnouncedBlock>), SenderViolation> {
        let frame = "BlockAnnounce";
        let n = a.indexes.len();
        if a.hashes.len() != n || a.proofs.len() != n {
            return Err(SenderViolation::ListLengths { frame });
        }
        if n > MAX_ANNOUNCE_BLOCKS {
            return Err(SenderViolation::TooManyBlocks { frame, count: n });
        }
        let (path, size, file, b) = self.large(a.file_id, frame)?;
        let mut announced = Vec::with_capacity(n);
        for i in 0..n {
            let index = a.indexes[i];
            if index >= b.count || !announceable(block_len(size, index), tails) {
                return Err(SenderViolation::NotAnnounceable {
                    path: path.to_string(),
                    index,
                });
            }
            let (Ok(hash), Ok(proof)) = (
                <[u8; 32]>::try_from(a.hashes[i].as_slice()),
                <[u8; 32]>::try_from(a.proofs[i].as_slice()),
            ) else {
                return Err(SenderViolation::MalformedAnnounce {
                    path: path.to_string(),
                    index,
                });
            };
            announced.push(AnnouncedBlock {
                index,
                hash: BlockHash::from_bytes(hash),
                proof: Proof(proof),
            });
        }
        claim_all(path, b, &a.indexes)?;
        let claimed = ClaimedBlock {
            file: file.clone(),
            path: path.clone(),
            size,
            len: BLOCK_SIZE as u64,
        };
        Ok((claimed, announced))
    }

    /// A ResumeCheck: blocks held from an earlier run, each checked once, with a 32-byte hash
    /// each.
    pub fn claim_resume(
        &mut self,
        c: &pb::ResumeCheck,
    ) -> Result<ClaimedResume<L>, SenderViolation> {
        let frame = "ResumeCheck";
        let n = c.indexes.len();
        if c.hashes.len() != n {
            return Err(SenderViolation::ListLengths { frame });
        }
        if n > MAX_ANNOUNCE_BLOCKS {
            return Err(SenderViolation::TooManyBlocks { frame, count: n });
        }
        let (path, size, file, b) = self.large(c.file_id, frame)?;
        let mut hashes = Vec::with_capacity(n);
        for h in &c.hashes {
            hashes.push(<[u8; 32]>::try_from(h.as_slice()).map_err(|_| {
                SenderViolation::MalformedResumeHash {
                    path: path.to_string(),
                }
            })?);
        }
        // Checked before anything is claimed: a refused check claims nothing.
        let mut unique = HashSet::with_capacity(n);
        for &index in &c.indexes {
            if !b.held.contains(index) || !unique.insert(index) {
                return Err(SenderViolation::NotHeld {
                    path: path.to_string(),
                    index,
                });
            }
        }
        for &index in &c.indexes {
            b.held.remove(index);
        }
        check_scatter(path, b)?;
        Ok(ClaimedResume {
            file: file.clone(),
            path: path.clone(),
            size,
            hashes,
        })
    }

    /// A PackAnnounce: 1 to [`MAX_OFFER_ENTRIES`] distinct small files in flight and in no
    /// other pack, whose sizes add up to what a block store keeps (1 to 4 MiB), with a 32-byte
    /// hash and proof. Their content now comes as the pack's (not in a Batch); the first file's
    /// id names it.
    pub fn claim_pack(&mut self, a: &pb::PackAnnounce) -> Result<ClaimedPack, SenderViolation> {
        let n = a.file_ids.len();
        if n == 0 || n > MAX_OFFER_ENTRIES {
            return Err(SenderViolation::PackFiles(n));
        }
        let mut seen = HashSet::with_capacity(n);
        let mut len = 0u64;
        let mut paths = Vec::with_capacity(n);
        for &id in &a.file_ids {
            let f = self.small(id).map_err(|e| match e {
                SenderViolation::WrongFileKind { what, .. } => SenderViolation::WrongFileKind {
                    frame: "PackAnnounce",
                    what,
                    id,
                },
                _ => SenderViolation::UnknownFile {
                    frame: "PackAnnounce",
                    id,
                },
            })?;
            if !seen.insert(id) {
                return Err(SenderViolation::Duplicate(f.path.to_string()));
            }
            len += f.size;
            paths.push(f.path.clone());
        }
        if !storable(len as usize) || len > BLOCK_SIZE as u64 {
            return Err(SenderViolation::PackSize { len });
        }
        let (Ok(hash), Ok(proof)) = (
            <[u8; 32]>::try_from(a.hash.as_slice()),
            <[u8; 32]>::try_from(a.proof.as_slice()),
        ) else {
            return Err(SenderViolation::MalformedPack {
                path: paths[0].to_string(),
            });
        };
        let pack_id = a.file_ids[0];
        for &id in &a.file_ids {
            // Each is a small file in flight: checked above.
            if let Some(InFlight {
                path,
                size,
                content: Content::Small(file),
            }) = self.files.remove(&id)
            {
                let content = Content::Packed(file);
                self.files.insert(
                    id,
                    InFlight {
                        path,
                        size,
                        content,
                    },
                );
            }
        }
        self.packed += n;
        self.packs.insert(
            pack_id,
            Pack {
                files: a.file_ids.clone(),
                hash,
                len,
                on_wire: false,
            },
        );
        Ok(ClaimedPack {
            pack_id,
            announced: AnnouncedBlock {
                index: 0,
                hash: BlockHash::from_bytes(hash),
                proof: Proof(proof),
            },
            len,
            paths,
        })
    }

    /// The receiver asks the sender for a pack's bytes (no store had it, or a fellow
    /// destination did not deliver it): a Pack frame for it may come, once.
    pub fn pack_on_wire(&mut self, pack_id: u64) -> Result<(), SenderViolation> {
        match self.packs.get_mut(&pack_id) {
            Some(p) if !p.on_wire => {
                p.on_wire = true;
                Ok(())
            }
            _ => Err(SenderViolation::UnknownPack(pack_id)),
        }
    }

    /// A Pack frame: for a pack the receiver asked the sender for, of its announced length
    /// and hash. Returns its files, which leave the session's bookkeeping (the caller writes
    /// them from the bytes once they match the hash).
    pub fn claim_pack_data(
        &mut self,
        h: &pb::PackHeader,
    ) -> Result<Vec<PackedFile<S>>, SenderViolation> {
        let p = match self.packs.get(&h.pack_id) {
            Some(p) if p.on_wire => p,
            _ => return Err(SenderViolation::UnknownPack(h.pack_id)),
        };
        if u64::from(h.raw_len) != p.len || h.hash.as_slice() != p.hash.as_slice() {
            return Err(SenderViolation::PackMismatch {
                id: h.pack_id,
                got: u64::from(h.raw_len),
                len: p.len,
            });
        }
        Ok(self.release_pack(h.pack_id))
    }

    /// A pack's bytes came from a block store (this node's or a fellow destination's): its
    /// files, unless the pack is gone or asked of the sender meanwhile.
    pub fn take_pack(&mut self, pack_id: u64) -> Result<Vec<PackedFile<S>>, SenderViolation> {
        match self.packs.get(&pack_id) {
            Some(p) if !p.on_wire => Ok(self.release_pack(pack_id)),
            _ => Err(SenderViolation::UnknownPack(pack_id)),
        }
    }

    fn release_pack(&mut self, pack_id: u64) -> Vec<PackedFile<S>> {
        let Some(pack) = self.packs.remove(&pack_id) else {
            return Vec::new();
        };
        self.packed -= pack.files.len();
        let mut out = Vec::with_capacity(pack.files.len());
        for id in pack.files {
            if let Some(InFlight {
                path,
                size,
                content: Content::Packed(file),
            }) = self.files.remove(&id)
            {
                // As for a batch: its path may come again (and then find the file).
                self.paths.remove(&path);
                out.push(PackedFile { file, path, size });
            }
        }
        out
    }

    /// Claimed blocks that must come over the wire after all (the block store did not have
    /// them, or a held block did not match the sender's hash): requested again.
    pub fn need_again(
        &mut self,
        file_id: u64,
        indexes: impl IntoIterator<Item = u64>,
    ) -> Result<(), SenderViolation> {
        let (path, _, _, b) = self.large(file_id, "NeedBlocks")?;
        for i in indexes {
            b.need.insert(i);
        }
        check_scatter(path, b)
    }

    /// `n` claimed blocks of a large file are verified and written. When that was the last the
    /// file leaves the session's bookkeeping and is returned: the caller commits it.
    pub fn blocks_written(&mut self, file_id: u64, n: u64) -> Result<Option<L>, SenderViolation> {
        let (path, _, _, b) = self.large(file_id, "block")?;
        // More than the file has can only follow a claim this state refused: a bug, but one
        // that must not publish a file early.
        b.remaining = b
            .remaining
            .checked_sub(n)
            .ok_or_else(|| SenderViolation::NotRequested {
                path: path.to_string(),
                index: b.count,
            })?;
        if b.remaining > 0 {
            return Ok(None);
        }
        let Some(InFlight {
            path,
            content: Content::Large(file, _),
            ..
        }) = self.files.remove(&file_id)
        else {
            unreachable!("found above");
        };
        self.paths.remove(&path);
        self.large -= 1;
        Ok(Some(file))
    }

    /// Finish: every file asked for must be complete.
    pub fn check_finished(&self) -> Result<(), SenderViolation> {
        match self.files.values().next() {
            None => Ok(()),
            Some(f) => Err(SenderViolation::Incomplete {
                count: self.files.len(),
                example: f.path.to_string(),
            }),
        }
    }
}

fn claim_all(path: &PeerPath, b: &mut Blocks, indexes: &[u64]) -> Result<(), SenderViolation> {
    for &index in indexes {
        if !b.need.remove(index) {
            return Err(SenderViolation::NotRequested {
                path: path.to_string(),
                index,
            });
        }
    }
    check_scatter(path, b)
}

/// The block sets stay small: a sender that scatters its blocks (or its resume checks) is
/// refused rather than let grow them.
fn check_scatter(path: &PeerPath, b: &Blocks) -> Result<(), SenderViolation> {
    if b.need.range_count() + b.held.range_count() > MAX_FILE_RANGES {
        return Err(SenderViolation::Scattered {
            path: path.to_string(),
        });
    }
    Ok(())
}

/// A symlink target from the sender: non-empty, at most [`MAX_LINK_TARGET`] bytes, no NUL.
pub fn check_link_target(path: &PeerPath, target: &[u8]) -> Result<(), SenderViolation> {
    if target.is_empty() || target.len() > MAX_LINK_TARGET || target.contains(&0) {
        return Err(SenderViolation::LinkTarget(path.to_string()));
    }
    Ok(())
}

/// A `--delete` listing: at most [`MAX_LISTING_NAMES`] plain names (no `/`, `.`, `..`).
pub fn check_listing(names: Vec<Vec<u8>>) -> Result<HashSet<Vec<u8>>, SenderViolation> {
    if names.len() > MAX_LISTING_NAMES {
        return Err(SenderViolation::ListingTooLong);
    }
    let mut keep = HashSet::with_capacity(names.len());
    for name in names {
        if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
            return Err(SenderViolation::ListingName(
                String::from_utf8_lossy(&name).into_owned(),
            ));
        }
        keep.insert(name);
    }
    Ok(keep)
}

/// Most extended attributes one entry may carry: file systems keep a few per inode (ext4: one
/// block), so thousands of tiny ones are an attack on the destination, not metadata.
pub const MAX_XATTRS_PER_ENTRY: usize = 128;

/// An entry's extended attributes: `user.<something>` names of at most 255 bytes without NUL,
/// at most [`MAX_XATTRS_PER_ENTRY`] of them and `max` bytes of names and values together.
/// Returns that total.
pub fn check_xattrs(
    path: &PeerPath,
    xattrs: &[pb::Xattr],
    max: usize,
) -> Result<u64, SenderViolation> {
    if xattrs.len() > MAX_XATTRS_PER_ENTRY {
        return Err(SenderViolation::XattrCount {
            path: path.to_string(),
            count: xattrs.len(),
            max: MAX_XATTRS_PER_ENTRY,
        });
    }
    let mut total = 0u64;
    for x in xattrs {
        if !x.name.starts_with(b"user.")
            || x.name.len() == b"user.".len()
            || x.name.len() > 255
            || x.name.contains(&0)
        {
            return Err(SenderViolation::XattrName {
                path: path.to_string(),
                name: String::from_utf8_lossy(&x.name).into_owned(),
            });
        }
        total += (x.name.len() + x.value.len()) as u64;
    }
    if total > max as u64 {
        return Err(SenderViolation::XattrSize {
            path: path.to_string(),
            total,
            max,
        });
    }
    Ok(total)
}

#[cfg(test)]
mod tests;
