//! Drives the sender's reply rules with arbitrary sequences, the way its driver does: offers and
//! block announces go out, and the receiver answers with Wants and NeedBlocks of any ids,
//! lengths, skip flags, bitmaps and ranges. Must never panic, and a shadow model checks what the
//! sender would act on:
//! - a Want is taken only for the oldest offer, with its id and one answer per entry; a
//!   NeedBlocks only for the oldest announce, with its file id; anything else is a violation
//!   (after which the session ends, as the driver ends it);
//! - what a Want asks of a file stays within that file's blocks, only files are asked for, a
//!   dry run never sends data, and a skipped file is only read for the digest;
//! - a NeedBlocks sends only announced blocks, in order, and counts every other one as taken;
//! - a large file's plan splits the needed blocks between the wire and the store (full blocks
//!   only) and leaves the rest held.
#![no_main]

use std::collections::VecDeque;

use ferry_mover::cas::storable;
use ferry_mover::session::SMALL_FILE_MAX;
use ferry_mover::session::sender::state::{Announced, Replies, Wanted, plan_large};
use ferry_mover::wire::{BLOCK_SIZE, block_count, block_len};
use ferry_proto::wire::v1 as pb;
use libfuzzer_sys::fuzz_target;

#[path = "input.rs"]
mod input;
use input::Input;

/// A file size around the interesting edges: small, a block's multiples, and huge.
fn size(input: &mut Input) -> Option<u64> {
    let b = BLOCK_SIZE as u64;
    Some(match input.byte()? % 6 {
        0 => input.small(SMALL_FILE_MAX + 1)?,
        1 => SMALL_FILE_MAX + 1 + input.small(8)?,
        2 => b * input.small(40)?,
        3 => b * input.small(40)? + 1 + input.small(b - 1)?,
        4 => u64::MAX - input.small(8)?,
        _ => SMALL_FILE_MAX,
    })
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let dry_run = input.byte().is_some_and(|b| b & 1 == 1);
    let mut replies: Replies<u64> = Replies::new(0, dry_run);
    let mut offers: VecDeque<(u64, Vec<pb::Entry>)> = VecDeque::new();
    let mut announces: VecDeque<(u64, u64, Vec<u64>)> = VecDeque::new();
    let mut next_offer = 0u64;
    while let Some(op) = input.byte() {
        match op % 4 {
            0 => {
                let n = input.small(5).unwrap_or(0) as usize;
                let mut entries = Vec::new();
                for i in 0..n {
                    let (Some(kind), Some(size)) = (input.small(4), size(&mut input)) else {
                        break;
                    };
                    entries.push(pb::Entry {
                        path: format!("f{next_offer}.{i}").into_bytes(),
                        kind: kind as i32,
                        size,
                        ..pb::Entry::default()
                    });
                }
                replies.offered(next_offer, entries.clone());
                offers.push_back((next_offer, entries));
                next_offer += 1;
            }
            1 => {
                let (Some(file_id), Some(size)) = (input.small(8), size(&mut input)) else {
                    break;
                };
                let count = block_count(size).min(64);
                let n = input.small(6).unwrap_or(0);
                let indexes: Vec<u64> = (0..n).filter_map(|_| input.small(count)).collect();
                replies.announced(Announced {
                    file_id,
                    size,
                    indexes: indexes.clone(),
                    file: 0,
                });
                announces.push_back((file_id, size, indexes));
            }
            2 => {
                // An answer to the oldest offer, mostly with its id and length.
                let (expected_id, expected_len) =
                    offers.front().map_or((0, 0), |(id, e)| (*id, e.len()));
                let Some(twist) = input.byte() else { break };
                let offer_id = if twist & 1 == 0 {
                    expected_id
                } else {
                    u64::from(twist)
                };
                let len = if twist & 2 == 0 {
                    expected_len
                } else {
                    usize::from(twist >> 5)
                };
                let mut entries = Vec::new();
                for _ in 0..len {
                    let Some(flags) = input.byte() else { break };
                    let bitmap_len = usize::from(flags >> 4);
                    let need_blocks = input.bytes(bitmap_len);
                    let pairs = usize::from(flags >> 2 & 3) * 2;
                    let need_ranges: Vec<u64> = (0..pairs)
                        .map(|_| input.small(70).unwrap_or(0) as u64)
                        .collect();
                    entries.push(pb::EntryWant {
                        skip: flags & 1 == 1,
                        file_id: u64::from(flags),
                        need_blocks,
                        need_ranges,
                        ..pb::EntryWant::default()
                    });
                }
                let answered = entries.clone();
                let got = replies.on_want(pb::Want { offer_id, entries });
                let Some((id, offered)) = offers.pop_front() else {
                    assert!(got.is_err(), "a Want with no offer owed was taken");
                    return;
                };
                if id != offer_id || offered.len() != answered.len() {
                    assert!(got.is_err(), "a Want for another offer or length was taken");
                    return;
                }
                let Ok(wanted) = got else { return };
                let files: Vec<(&pb::Entry, &pb::EntryWant)> = offered
                    .iter()
                    .zip(&answered)
                    .filter(|(e, _)| e.kind == pb::EntryKind::File as i32)
                    .collect();
                assert_eq!(wanted.len(), files.len(), "one answer per offered file");
                for (w, (entry, answer)) in wanted.iter().zip(files) {
                    match w {
                        Wanted::Unchanged(e) => {
                            assert!(answer.skip);
                            assert_eq!(e, entry);
                        }
                        Wanted::Small { file_id, entry: e } => {
                            assert!(!dry_run && !answer.skip && entry.size <= SMALL_FILE_MAX);
                            assert_eq!((e, *file_id), (entry, answer.file_id));
                        }
                        Wanted::Large {
                            file_id,
                            entry: e,
                            need,
                        } => {
                            assert!(!dry_run && !answer.skip && entry.size > SMALL_FILE_MAX);
                            assert_eq!((e, *file_id), (entry, answer.file_id));
                            // Sets may span trillions of blocks: checked by their ranges.
                            let count = block_count(entry.size);
                            assert!(
                                need.ranges().all(|(_, end)| end <= count),
                                "a block past the file"
                            );
                            for tails in [false, true] {
                                let plain = plan_large(entry.size, need, false, tails);
                                assert_eq!(&plain.send, need);
                                assert!(plain.announce.is_empty());
                                assert_eq!(plain.held, need.complement(count));
                                let dedup = plan_large(entry.size, need, true, tails);
                                let last = count - 1;
                                let last_len = block_len(entry.size, last);
                                let short_last = last_len < BLOCK_SIZE as u64;
                                let long_tail = tails && storable(last_len as usize);
                                assert!(
                                    !(short_last && !long_tail && dedup.announce.contains(last)),
                                    "a short block announced"
                                );
                                assert!(
                                    dedup.send.iter().all(|i| i == last && short_last && !long_tail),
                                    "a block the store keeps sent past it"
                                );
                                let mut both = dedup.announce.clone();
                                for i in dedup.send.iter() {
                                    assert!(both.insert(i), "block {i} both sent and announced");
                                }
                                assert_eq!(&both, need, "the plan lost or added a needed block");
                                assert_eq!(dedup.held, need.complement(count));
                            }
                        }
                    }
                }
            }
            _ => {
                let (expected_id, expected_n) = announces
                    .front()
                    .map_or((0, 0), |(id, _, ix)| (*id, ix.len()));
                let Some(twist) = input.byte() else { break };
                let file_id = if twist & 1 == 0 {
                    expected_id
                } else {
                    u64::from(twist)
                };
                let need_blocks = input.bytes(expected_n.div_ceil(8) + usize::from(twist >> 6));
                let got = replies.on_need_blocks(&pb::NeedBlocks {
                    file_id,
                    need_blocks: need_blocks.clone(),
                    ..pb::NeedBlocks::default()
                });
                let Some((id, size, indexes)) = announces.pop_front() else {
                    assert!(got.is_err(), "a NeedBlocks with no announce owed was taken");
                    return;
                };
                if id != file_id {
                    assert!(got.is_err(), "a NeedBlocks for another file was taken");
                    return;
                }
                let needed = got.expect("the answer to the oldest announce");
                let bit = |i: usize| {
                    need_blocks
                        .get(i / 8)
                        .is_some_and(|b| b >> (i % 8) & 1 == 1)
                };
                let send: Vec<u64> = indexes
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| bit(*i))
                    .map(|(_, x)| *x)
                    .collect();
                let taken: u64 = indexes
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !bit(*i))
                    .map(|(_, x)| block_len(size, *x))
                    .sum();
                assert_eq!(
                    needed.send, send,
                    "sent blocks are not the announced ones asked for"
                );
                assert_eq!(needed.taken_bytes, taken);
                assert_eq!(needed.announced.indexes, indexes);
            }
        }
        assert_eq!(replies.settled(), offers.is_empty() && announces.is_empty());
        assert_eq!(replies.owes_want(), !offers.is_empty());
    }
});
