//! Drives the receiver's protocol state with arbitrary message sequences, the way the driver
//! does: files are asked for, then Batch, Block, BlockAnnounce and ResumeCheck frames with any
//! ids, indexes, lengths and list shapes claim their content, the effects report blocks written
//! (only blocks they claimed, as the real effects do) and blocks the store or a resume did not
//! give are requested again; streams route arbitrary frame types. Must never panic, and a shadow
//! model checks the rules that keep data whole:
//! - a block is never claimed while it is claimed or written already;
//! - a large file is complete exactly when each of its blocks was written once, never earlier,
//!   and only once;
//! - only blocks held from an earlier run pass a ResumeCheck;
//! - a small file comes once, in a Batch or in the one pack that named it, never both, and a
//!   pack's files come back in its order with their offered sizes;
//! - what is in flight stays within the session's bounds.
#![no_main]

use std::collections::{BTreeSet, HashMap};

use ferry_mover::session::receiver::state::{
    MAX_IN_FLIGHT, ReceiverState, Route, StreamRules,
};
use ferry_mover::tree::peer_path::PeerPath;
use ferry_mover::wire::{BLOCK_SIZE, BlockSet, FrameType, block_count, block_len};
use ferry_proto::wire::v1 as pb;
use libfuzzer_sys::fuzz_target;

const BLOCK: u64 = BLOCK_SIZE as u64;

#[path = "input.rs"]
mod input;
use input::Input;

/// What the shadow knows of a large file.
#[derive(Default)]
struct Large {
    count: u64,
    held: BTreeSet<u64>,
    /// Claimed, not yet written or requested again.
    pending: BTreeSet<u64>,
    written: BTreeSet<u64>,
    done: bool,
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let mut st: ReceiverState<u64, u64> = ReceiverState::default();
    let mut streams: Vec<StreamRules> = (0..3)
        .map(|i| StreamRules::new(i, i != 2, true).with_packs(i != 0))
        .collect();
    // Packs claimed and not yet delivered: their files (id, size) in order.
    let mut packs: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let mut large: HashMap<u64, Large> = HashMap::new();
    let mut small_sizes: HashMap<u64, u64> = HashMap::new();
    let mut next_name = 0u64;
    while let Some(op) = input.byte() {
        // Ids near the ones handed out, so most frames name real files.
        let id = |input: &mut Input| input.small(next_name + 3);
        match op % 12 {
            0 => {
                let (Some(size), Some(big)) = (input.small(200), input.byte()) else {
                    return;
                };
                // Some of 16 KiB steps up to 1 MiB, so that packs of 1 to 4 MiB can form.
                let size = if big & 1 == 1 { (size % 65) * 16384 } else { size };
                let path = PeerPath::parse(format!("s{}", input.small(8).unwrap_or(0)).as_bytes())
                    .unwrap();
                if let Ok(fid) = st.want_small(path, size, size) {
                    small_sizes.insert(fid, size);
                    next_name = next_name.max(fid);
                }
            }
            1 => {
                let (Some(blocks), Some(tail), Some(held_bits)) =
                    (input.small(12), input.small(3), input.byte())
                else {
                    return;
                };
                let size = (blocks + 1) * BLOCK - tail * 1000;
                let count = block_count(size);
                let mut held = BlockSet::new();
                for i in 0..count.min(8) {
                    if held_bits & (1 << i) != 0 {
                        held.insert(i);
                    }
                }
                let path =
                    PeerPath::parse(format!("l{}", input.small(8).unwrap_or(0)).as_bytes()).unwrap();
                let held_shadow: BTreeSet<u64> = held.iter().collect();
                if let Ok((fid, need)) = st.want_large(path, size, held, size) {
                    assert_eq!(need.len() + held_shadow.len() as u64, count);
                    for i in need.iter() {
                        assert!(!held_shadow.contains(&i));
                    }
                    large.insert(
                        fid,
                        Large {
                            count,
                            held: held_shadow,
                            ..Default::default()
                        },
                    );
                    next_name = next_name.max(fid);
                }
            }
            2 => {
                let Some(n) = input.small(4) else { return };
                let mut files = Vec::new();
                let mut total = 0usize;
                for _ in 0..n {
                    let (Some(fid), Some(raw), Some(stored)) =
                        (id(&mut input), input.small(200), input.small(200))
                    else {
                        return;
                    };
                    total += stored as usize;
                    files.push(pb::BatchFile {
                        file_id: fid,
                        raw_len: raw as u32,
                        stored_len: stored as u32,
                        codec: 0,
                        hash: vec![0; 32],
                    });
                }
                let data_len = total + input.small(2).unwrap_or(0) as usize;
                if let Ok(claimed) = st.claim_batch(files, data_len) {
                    let mut end = 0;
                    for c in claimed {
                        // A batch names small files the offer declared, at their size, and the
                        // chunks tile the frame.
                        let size = small_sizes
                            .remove(&c.entry.file_id)
                            .expect("claimed an unknown file");
                        assert_eq!(c.file, size);
                        assert_eq!(u64::from(c.entry.raw_len), size);
                        assert_eq!(c.range.start, end);
                        end = c.range.end;
                    }
                    assert_eq!(end, data_len);
                }
            }
            3 => {
                let (Some(fid), Some(index), Some(short)) =
                    (id(&mut input), input.small(16), input.small(3))
                else {
                    return;
                };
                let len = large
                    .get(&fid)
                    .map_or(BLOCK, |l| block_len(l.count * BLOCK, index))
                    .saturating_sub(short);
                let h = pb::BlockHeader {
                    file_id: fid,
                    index,
                    raw_len: len as u32,
                    codec: 0,
                    hash: vec![0; 32],
                };
                if let Ok(c) = st.claim_block(&h) {
                    let l = large.get_mut(&fid).expect("claimed a block of an unknown file");
                    assert!(!l.done);
                    assert!(index < l.count);
                    assert_eq!(c.len, block_len(c.size, index));
                    assert!(!l.held.contains(&index), "a held block was claimed unconfirmed");
                    assert!(l.pending.insert(index), "block {index} claimed twice");
                    assert!(!l.written.contains(&index), "block {index} written twice");
                }
            }
            4 | 5 => {
                let (Some(fid), Some(n)) = (id(&mut input), input.small(4)) else {
                    return;
                };
                let mut indexes = Vec::new();
                for _ in 0..n {
                    indexes.push(input.small(16).unwrap_or(0));
                }
                let hashes = vec![vec![1u8; 32]; indexes.len() + usize::from(input.small(8) == Some(0))];
                let resume = op % 10 == 5;
                let claimed: Option<Vec<u64>> = if !resume {
                    let a = pb::BlockAnnounce {
                        file_id: fid,
                        indexes: indexes.clone(),
                        proofs: vec![vec![2u8; 32]; hashes.len()],
                        hashes,
                    };
                    st.claim_announce(&a, op % 3 == 0).ok().map(|(c, blocks)| {
                        assert_eq!(c.len, BLOCK);
                        blocks.iter().map(|b| b.index).collect()
                    })
                } else {
                    let c = pb::ResumeCheck {
                        file_id: fid,
                        indexes: indexes.clone(),
                        hashes,
                    };
                    st.claim_resume(&c).ok().map(|_| indexes.clone())
                };
                if let Some(claimed) = claimed {
                    let l = large.get_mut(&fid).expect("claimed blocks of an unknown file");
                    for i in &claimed {
                        assert!(*i < l.count);
                        // Held blocks pass only a ResumeCheck; everything else only as requested.
                        assert_eq!(l.held.contains(i), resume, "block {i}: held vs resume");
                        assert!(!l.written.contains(i) && !l.pending.contains(i), "block {i} claimed twice");
                        l.held.remove(i);
                        l.pending.insert(*i);
                    }
                }
            }
            6 => {
                // The store (or a resume) did not give some claimed blocks: requested again.
                let Some(fid) = id(&mut input) else { return };
                let Some(l) = large.get_mut(&fid) else { continue };
                let pick = input.byte().unwrap_or(0);
                let again: Vec<u64> = l
                    .pending
                    .iter()
                    .copied()
                    .enumerate()
                    .filter(|(k, _)| pick & (1 << (k % 8)) != 0)
                    .map(|(_, i)| i)
                    .collect();
                if st.need_again(fid, again.iter().copied()).is_ok() {
                    for i in again {
                        l.pending.remove(&i);
                    }
                }
            }
            7 => {
                // The effects wrote some of what they claimed.
                let (Some(fid), Some(n)) = (id(&mut input), input.small(4)) else {
                    return;
                };
                let Some(l) = large.get_mut(&fid) else { continue };
                let n = (n + 1).min(l.pending.len() as u64);
                if n == 0 || l.done {
                    continue;
                }
                let moved: Vec<u64> = l.pending.iter().copied().take(n as usize).collect();
                for i in &moved {
                    l.pending.remove(i);
                    assert!(l.written.insert(*i), "block {i} written twice");
                }
                let r = st.blocks_written(fid, n).expect("writing claimed blocks is always fine");
                let complete = l.written.len() as u64 == l.count;
                assert_eq!(r.is_some(), complete, "completion at {} of {}", l.written.len(), l.count);
                if complete {
                    l.done = true;
                }
            }
            8 => {
                let (Some(s), Some(t)) = (input.small(3), input.byte()) else {
                    return;
                };
                if let Ok(frame) = FrameType::from_byte(t)
                    && let Ok(route) = streams[s as usize].route(frame)
                {
                    if s == 2 {
                        assert_ne!(route, Route::Announce, "announce without the block store");
                        assert_ne!(route, Route::PackAnnounce, "a pack without the block store");
                    }
                    if s == 0 {
                        assert_ne!(route, Route::PackAnnounce, "a pack without the capability");
                    }
                    if matches!(route, Route::DirDone | Route::Finish) {
                        assert_eq!(s, 0, "only stream 0 closes the session");
                    }
                }
            }
            10 => {
                let Some(n) = input.small(8) else { return };
                let mut ids = Vec::new();
                for _ in 0..=n {
                    ids.push(id(&mut input).unwrap_or(0));
                }
                let a = pb::PackAnnounce {
                    file_ids: ids.clone(),
                    hash: vec![3; 32],
                    proof: vec![4; 32],
                };
                if let Ok(c) = st.claim_pack(&a) {
                    let mut files = Vec::new();
                    for fid in &ids {
                        let size = small_sizes.remove(fid).expect("packed an unknown or claimed file");
                        files.push((*fid, size));
                    }
                    let total: u64 = files.iter().map(|f| f.1).sum();
                    assert_eq!(c.len, total);
                    assert!((1 << 20..=BLOCK).contains(&total), "a pack of {total} bytes");
                    assert_eq!(c.pack_id, ids[0]);
                    assert!(packs.insert(c.pack_id, files).is_none(), "a pack claimed twice");
                }
            }
            11 => {
                let (Some(pid), Some(how), Some(len)) =
                    (id(&mut input), input.small(3), input.small(2))
                else {
                    return;
                };
                let got = match how {
                    0 => st.take_pack(pid),
                    1 => {
                        let _ = st.pack_on_wire(pid);
                        continue;
                    }
                    _ => {
                        let announced = packs.get(&pid).map_or(0, |f| f.iter().map(|x| x.1).sum());
                        let h = pb::PackHeader {
                            pack_id: pid,
                            raw_len: (announced + len) as u32,
                            codec: 0,
                            hash: vec![3; 32],
                        };
                        st.claim_pack_data(&h)
                    }
                };
                if let Ok(files) = got {
                    let want = packs.remove(&pid).expect("delivered an unknown pack");
                    let got: Vec<(u64, u64)> =
                        files.iter().map(|f| (f.file, f.size)).collect();
                    // The payload is the offered size, and the files come in the pack's order.
                    let sizes: Vec<(u64, u64)> = want.iter().map(|(_, s)| (*s, *s)).collect();
                    assert_eq!(got, sizes);
                }
            }
            _ => {
                let unfinished = large.values().any(|l| !l.done)
                    || !small_sizes.is_empty()
                    || !packs.is_empty();
                assert_eq!(st.check_finished().is_err(), unfinished);
            }
        }
        assert!(st.in_flight() <= MAX_IN_FLIGHT);
    }
});
