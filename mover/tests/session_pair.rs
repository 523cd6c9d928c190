//! The sender's and the receiver's protocol states wired to each other through byte buffers: whole
//! transfers of an in-memory tree, without TLS, sockets, threads, clocks or a filesystem. Every
//! frame is encoded and decoded with the real codec; the "effects" are a few lines over maps.
//! The interleaving of streams and of the two ends is picked by a seeded generator, so a run is
//! deterministic and a failing seed reproduces exactly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};

use bytes::{Bytes, BytesMut};
use ferry_mover::session::SMALL_FILE_MAX;
use ferry_mover::session::receiver::state::{ReceiverState, Route, SenderViolation, StreamRules};
use ferry_mover::session::sender::state::{Announced, Replies, Wanted, plan_large};
use ferry_mover::tree::peer_path::PeerPath;
use ferry_mover::wire::{
    BLOCK_SIZE, Bitmap, BlockSet, Message, block_count, block_len, decode_frame,
};
use ferry_proto::wire::v1 as pb;

type Tree = BTreeMap<String, Vec<u8>>;

/// A deterministic generator (xorshift64*), so interleavings reproduce from their seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    (0..len).map(|_| r.below(256) as u8).collect()
}

/// One direction of one stream: encoded frames waiting to be read.
#[derive(Default)]
struct Pipe(BytesMut);

impl Pipe {
    fn send(&mut self, m: &Message) {
        m.encode(&mut self.0).unwrap();
    }
    fn recv(&mut self) -> Option<Message> {
        decode_frame(&mut self.0)
            .unwrap()
            .map(|f| Message::decode(f).unwrap())
    }
}

/// A large file on the receiver, as the effects would stage it.
#[derive(Clone)]
struct Staged {
    path: String,
    data: std::rc::Rc<std::cell::RefCell<Vec<u8>>>,
}

struct Receiver {
    state: ReceiverState<String, Staged>,
    rules: Vec<StreamRules>,
    dest: Tree,
    /// Content an earlier run left in staging for a path (resumed if the sender confirms it).
    staging: HashMap<String, Vec<u8>>,
    resumed_blocks: u64,
    /// Streams whose Done was read.
    done: Vec<bool>,
    finished: bool,
}

impl Receiver {
    fn entry(&mut self, e: &pb::Entry) -> Result<pb::EntryWant, SenderViolation> {
        let path = PeerPath::parse(&e.path).unwrap();
        let name = path.to_string();
        let mut want = pb::EntryWant::default();
        if self
            .dest
            .get(&name)
            .is_some_and(|d| d.len() as u64 == e.size && e.mtime_sec == 1)
        {
            want.skip = true;
            return Ok(want);
        }
        if e.size <= SMALL_FILE_MAX {
            want.file_id = self.state.want_small(path, e.size, name)?;
            return Ok(want);
        }
        let count = block_count(e.size);
        let mut held = BlockSet::new();
        let mut data = vec![0; e.size as usize];
        if let Some(old) = self.staging.remove(&name) {
            for i in 0..count {
                let (s, n) = (
                    (i * BLOCK_SIZE as u64) as usize,
                    block_len(e.size, i) as usize,
                );
                if old.len() >= s + n {
                    data[s..s + n].copy_from_slice(&old[s..s + n]);
                    held.insert(i);
                }
            }
        }
        let staged = Staged {
            path: name,
            data: std::rc::Rc::new(std::cell::RefCell::new(data)),
        };
        let (id, need) = self.state.want_large(path, e.size, held, staged)?;
        let (need_blocks, need_ranges) = need.to_want(count);
        want.file_id = id;
        want.need_blocks = need_blocks;
        want.need_ranges = need_ranges;
        Ok(want)
    }

    fn commit(&mut self, s: Staged) {
        let data = s.data.borrow().clone();
        self.dest.insert(s.path, data);
    }

    /// Handles one frame of stream `i`; returns the reply, if any.
    fn on_frame(&mut self, i: usize, m: Message) -> Result<Option<Message>, SenderViolation> {
        let route = self.rules[i].route(m.frame_type())?;
        Ok(match (route, m) {
            (Route::Offer, Message::Offer(o)) => {
                ReceiverState::<String, Staged>::check_offer(o.entries.len())?;
                let mut entries = Vec::new();
                for e in &o.entries {
                    entries.push(self.entry(e)?);
                }
                Some(Message::Want(pb::Want {
                    offer_id: o.offer_id,
                    entries,
                }))
            }
            (Route::Data, Message::Batch { header, data }) => {
                for c in self.state.claim_batch(header.files, data.len())? {
                    let bytes = &data[c.range.clone()];
                    assert_eq!(blake3::hash(bytes).as_bytes().as_slice(), c.entry.hash);
                    self.dest.insert(c.file, bytes.to_vec());
                }
                None
            }
            (Route::Data, Message::Block { header, data }) => {
                let c = self.state.claim_block(&header)?;
                assert_eq!(blake3::hash(&data).as_bytes().as_slice(), header.hash);
                let off = (header.index * BLOCK_SIZE as u64) as usize;
                c.file.data.borrow_mut()[off..off + data.len()].copy_from_slice(&data);
                if let Some(done) = self.state.blocks_written(header.file_id, 1)? {
                    self.commit(done);
                }
                None
            }
            (Route::ResumeCheck, Message::ResumeCheck(rc)) => {
                let c = self.state.claim_resume(&rc)?;
                let mut bitmap = Bitmap::with_len(rc.indexes.len());
                let mut again = Vec::new();
                for (k, (&index, hash)) in rc.indexes.iter().zip(&c.hashes).enumerate() {
                    let off = (index * BLOCK_SIZE as u64) as usize;
                    let len = block_len(c.size, index) as usize;
                    let held = blake3::hash(&c.file.data.borrow()[off..off + len]);
                    if held.as_bytes() != hash {
                        bitmap.set(k);
                        again.push(index);
                    }
                }
                let kept = (rc.indexes.len() - again.len()) as u64;
                self.state.need_again(rc.file_id, again)?;
                self.resumed_blocks += kept;
                if kept > 0
                    && let Some(done) = self.state.blocks_written(rc.file_id, kept)?
                {
                    self.commit(done);
                }
                Some(Message::NeedBlocks(pb::NeedBlocks {
                    file_id: rc.file_id,
                    need_blocks: bitmap.into_bytes(),
                }))
            }
            (Route::Done, _) => {
                self.done[i] = true;
                None
            }
            (Route::Alive | Route::DirDone, _) => None,
            (Route::Finish, _) => {
                self.state.check_finished()?;
                self.finished = true;
                Some(Message::Summary(pb::Summary::default()))
            }
            (route, m) => panic!("route {route:?} for {:?}", m.frame_type()),
        })
    }
}

struct Sender {
    source: Tree,
    replies: Vec<Replies<()>>,
    /// Offers not yet sent, per stream.
    offers: Vec<Vec<pb::Offer>>,
    done_sent: Vec<bool>,
    finish_sent: bool,
    summary: bool,
    blocks_sent: u64,
}

impl Sender {
    fn block(&mut self, file_id: u64, e: &pb::Entry, index: u64) -> Message {
        self.blocks_sent += 1;
        let data = &self.source[std::str::from_utf8(&e.path).unwrap()];
        let off = (index * BLOCK_SIZE as u64) as usize;
        let bytes = &data[off..off + block_len(e.size, index) as usize];
        Message::Block {
            header: pb::BlockHeader {
                file_id,
                index,
                raw_len: bytes.len() as u32,
                codec: 0,
                hash: blake3::hash(bytes).as_bytes().to_vec(),
            },
            data: Bytes::copy_from_slice(bytes),
        }
    }

    /// Handles a reply on stream `i`; returns the frames it makes the sender send.
    fn on_reply(
        &mut self,
        i: usize,
        m: Message,
        entries: &HashMap<u64, pb::Entry>,
    ) -> Vec<Message> {
        let mut out = Vec::new();
        match m {
            Message::Want(w) => {
                for wanted in self.replies[i].on_want(w).unwrap() {
                    match wanted {
                        Wanted::Unchanged(_) => {}
                        Wanted::Small { file_id, entry } => {
                            let data =
                                self.source[std::str::from_utf8(&entry.path).unwrap()].clone();
                            out.push(Message::Batch {
                                header: pb::BatchHeader {
                                    files: vec![pb::BatchFile {
                                        file_id,
                                        raw_len: data.len() as u32,
                                        stored_len: data.len() as u32,
                                        codec: 0,
                                        hash: blake3::hash(&data).as_bytes().to_vec(),
                                    }],
                                },
                                data: Bytes::from(data),
                            });
                        }
                        Wanted::Large {
                            file_id,
                            entry,
                            need,
                        } => {
                            let plan = plan_large(entry.size, &need, false, false);
                            for index in plan.send.iter() {
                                out.push(self.block(file_id, &entry, index));
                            }
                            let held: Vec<u64> = plan.held.iter().collect();
                            if !held.is_empty() {
                                let data = &self.source[std::str::from_utf8(&entry.path).unwrap()];
                                let hashes = held
                                    .iter()
                                    .map(|&b| {
                                        let off = (b * BLOCK_SIZE as u64) as usize;
                                        let n = block_len(entry.size, b) as usize;
                                        blake3::hash(&data[off..off + n]).as_bytes().to_vec()
                                    })
                                    .collect();
                                self.replies[i].announced(Announced {
                                    file_id,
                                    size: entry.size,
                                    indexes: held.clone(),
                                    file: (),
                                });
                                out.push(Message::ResumeCheck(pb::ResumeCheck {
                                    file_id,
                                    indexes: held,
                                    hashes,
                                }));
                            }
                        }
                    }
                }
            }
            Message::NeedBlocks(nb) => {
                let needed = self.replies[i].on_need_blocks(&nb).unwrap();
                let e = entries[&needed.announced.file_id].clone();
                for index in needed.send {
                    out.push(self.block(needed.announced.file_id, &e, index));
                }
            }
            Message::Summary(_) => self.summary = true,
            other => panic!("unexpected {:?}", other.frame_type()),
        }
        out
    }
}

struct Outcome {
    dest: Tree,
    blocks_sent: u64,
    resumed_blocks: u64,
}

/// Runs a whole transfer of `source` over `streams` into `dest` (with `staging` left by an
/// earlier run), interleaved by `seed`.
fn transfer(
    source: &Tree,
    dest: Tree,
    staging: HashMap<String, Vec<u8>>,
    streams: usize,
    seed: u64,
) -> Outcome {
    // Offers of up to 3 entries, dealt to the streams in turn; the receiver's ids are learned
    // from its Wants, so the sender keeps each offered entry by the id it gets.
    let entries: Vec<pb::Entry> = source
        .iter()
        .map(|(p, d)| pb::Entry {
            path: p.as_bytes().to_vec(),
            kind: pb::EntryKind::File as i32,
            size: d.len() as u64,
            mtime_sec: 1,
            ..Default::default()
        })
        .collect();
    let mut offers = vec![Vec::new(); streams];
    for (k, chunk) in entries.chunks(3).enumerate() {
        offers[k % streams].push(pb::Offer {
            offer_id: k as u64 + 1,
            entries: chunk.to_vec(),
        });
    }
    for o in &mut offers {
        o.reverse();
    }
    let mut s = Sender {
        source: source.clone(),
        replies: (0..streams)
            .map(|i| Replies::new(i as u32, false))
            .collect(),
        offers,
        done_sent: vec![false; streams],
        finish_sent: false,
        summary: false,
        blocks_sent: 0,
    };
    let mut r = Receiver {
        state: ReceiverState::default(),
        rules: (0..streams)
            .map(|i| StreamRules::new(i as u32, false, true))
            .collect(),
        dest,
        staging,
        resumed_blocks: 0,
        done: vec![false; streams],
        finished: false,
    };
    let mut to_receiver: Vec<Pipe> = (0..streams).map(|_| Pipe::default()).collect();
    let mut to_sender: Vec<Pipe> = (0..streams).map(|_| Pipe::default()).collect();
    // Entries by the id the receiver gave them, read off the Wants as they pass.
    let mut by_id: HashMap<u64, pb::Entry> = HashMap::new();
    let offered: HashMap<u64, Vec<pb::Entry>> = s
        .offers
        .iter()
        .flatten()
        .map(|o| (o.offer_id, o.entries.clone()))
        .collect();
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut steps = 0;
    while !s.summary {
        steps += 1;
        assert!(steps < 100_000, "no progress");
        let i = rng.below(streams);
        match rng.below(3) {
            // The sender sends its next offer (at most 2 unanswered per stream).
            0 => {
                if let Some(o) = s.offers[i].pop() {
                    s.replies[i].offered(o.offer_id, o.entries.clone());
                    to_receiver[i].send(&Message::Offer(o));
                } else if s.replies[i].settled() && !s.done_sent[i] {
                    s.done_sent[i] = true;
                    to_receiver[i].send(&Message::Done(pb::Done::default()));
                } else if i == 0 && s.done_sent.iter().all(|d| *d) && !s.finish_sent {
                    // Stream 0 closes once every stream's replies are settled and Done went.
                    if s.replies.iter().all(|r| r.settled()) {
                        s.finish_sent = true;
                        to_receiver[0].send(&Message::Finish);
                    }
                }
            }
            // The receiver reads one frame of stream i; stream 0 closes only after every stream's
            // Done (the driver waits for them the same way).
            1 => {
                if i == 0 && r.done[0] && !r.done.iter().all(|d| *d) {
                    continue;
                }
                if let Some(m) = to_receiver[i].recv()
                    && let Some(reply) = r.on_frame(i, m).unwrap()
                {
                    if let Message::Want(w) = &reply {
                        for (e, ew) in offered[&w.offer_id].iter().zip(&w.entries) {
                            if !ew.skip {
                                by_id.insert(ew.file_id, e.clone());
                            }
                        }
                    }
                    to_sender[i].send(&reply);
                }
            }
            // The sender reads one reply of stream i; what it sends goes out on the same stream.
            _ => {
                if let Some(m) = to_sender[i].recv() {
                    for out in s.on_reply(i, m, &by_id) {
                        to_receiver[i].send(&out);
                    }
                }
            }
        }
    }
    assert!(r.finished);
    Outcome {
        dest: r.dest,
        blocks_sent: s.blocks_sent,
        resumed_blocks: r.resumed_blocks,
    }
}

fn sample_tree() -> Tree {
    let mut t = Tree::new();
    for k in 0..20 {
        t.insert(format!("d/small{k}"), content(k, 100 * k as usize));
    }
    t.insert("big".into(), content(100, 2 * BLOCK_SIZE + 12345));
    t.insert("d/huge".into(), content(101, 3 * BLOCK_SIZE));
    t.insert("empty".into(), Vec::new());
    t
}

#[test]
fn whole_transfers_arrive_intact_over_any_interleaving_and_stream_count() {
    let source = sample_tree();
    for streams in [1, 2, 4] {
        for seed in 0..8 {
            let out = transfer(&source, Tree::new(), HashMap::new(), streams, seed);
            assert_eq!(out.dest, source, "streams {streams}, seed {seed}");
            assert_eq!(out.blocks_sent, 6, "every block once");
        }
    }
}

#[test]
fn an_unchanged_destination_moves_no_data() {
    let source = sample_tree();
    let out = transfer(&source, source.clone(), HashMap::new(), 2, 1);
    assert_eq!(out.dest, source);
    assert_eq!(out.blocks_sent, 0);
}

#[test]
fn resumed_blocks_are_kept_only_where_they_match_the_source() {
    let source = sample_tree();
    // An earlier run left the first two blocks of `big` (one of them since corrupted) and the
    // first block of `d/huge`.
    let mut big = source["big"][..2 * BLOCK_SIZE].to_vec();
    big[BLOCK_SIZE + 7] ^= 0xff;
    let staging = HashMap::from([
        ("big".to_string(), big),
        (
            "d/huge".to_string(),
            source["d/huge"][..BLOCK_SIZE].to_vec(),
        ),
    ]);
    for seed in 0..4 {
        let out = transfer(&source, Tree::new(), staging.clone(), 3, seed);
        assert_eq!(out.dest, source, "seed {seed}");
        // Kept: big's block 0 and huge's block 0; the corrupted block came over the wire.
        assert_eq!(out.resumed_blocks, 2);
        assert_eq!(out.blocks_sent, 4);
    }
}

#[test]
fn a_block_sent_twice_is_refused_by_the_receiver() {
    let mut st: ReceiverState<(), ()> = ReceiverState::default();
    let size = 2 * BLOCK_SIZE as u64;
    let (id, _) = st
        .want_large(PeerPath::parse(b"f").unwrap(), size, BlockSet::new(), ())
        .unwrap();
    let data = content(7, BLOCK_SIZE);
    let frame = Message::Block {
        header: pb::BlockHeader {
            file_id: id,
            index: 1,
            raw_len: BLOCK_SIZE as u32,
            codec: 0,
            hash: blake3::hash(&data).as_bytes().to_vec(),
        },
        data: Bytes::from(data),
    };
    let mut pipe = Pipe::default();
    pipe.send(&frame);
    pipe.send(&frame);
    for expect_ok in [true, false] {
        let Some(Message::Block { header, .. }) = pipe.recv() else {
            panic!("no block");
        };
        assert_eq!(st.claim_block(&header).is_ok(), expect_ok);
    }
}
