//! One test per rule of the sender's state, in memory.

use super::*;
use crate::wire::BLOCK_SIZE;

const BLOCK: u64 = BLOCK_SIZE as u64;

fn file(path: &str, size: u64) -> pb::Entry {
    pb::Entry {
        path: path.as_bytes().to_vec(),
        kind: pb::EntryKind::File as i32,
        size,
        ..Default::default()
    }
}

fn dir(path: &str) -> pb::Entry {
    pb::Entry {
        path: path.as_bytes().to_vec(),
        kind: pb::EntryKind::Dir as i32,
        ..Default::default()
    }
}

fn answer(skip: bool, file_id: u64) -> pb::EntryWant {
    pb::EntryWant {
        skip,
        file_id,
        ..Default::default()
    }
}

fn set(indexes: &[u64]) -> BlockSet {
    let mut s = BlockSet::new();
    for &i in indexes {
        s.insert(i);
    }
    s
}

#[test]
fn wants_answer_offers_in_order_one_entry_each() {
    let mut r: Replies<()> = Replies::new(0, false);
    r.offered(1, vec![file("a", 1)]);
    r.offered(2, vec![file("b", 1)]);
    let wrong = pb::Want {
        offer_id: 2,
        entries: vec![answer(true, 0)],
    };
    assert_eq!(
        r.on_want(wrong),
        Err(ReceiverViolation::WantMismatch {
            got: 2,
            expected: 1
        })
    );
    r.offered(3, vec![file("c", 1), file("d", 1)]);
    let short = pb::Want {
        offer_id: 2,
        entries: vec![],
    };
    assert_eq!(
        r.on_want(short),
        Err(ReceiverViolation::WantLength {
            offer_id: 2,
            got: 0,
            offered: 1
        })
    );
    let good = pb::Want {
        offer_id: 3,
        entries: vec![answer(true, 0), answer(false, 9)],
    };
    assert_eq!(
        r.on_want(good).unwrap(),
        vec![
            Wanted::Unchanged(file("c", 1)),
            Wanted::Small {
                file_id: 9,
                entry: file("d", 1)
            }
        ]
    );
    assert!(r.settled());
    // Nothing owed: a Want now is out of order.
    assert!(matches!(
        r.on_want(pb::Want::default()),
        Err(ReceiverViolation::Unexpected {
            kind: FrameType::Want,
            ..
        })
    ));
}

#[test]
fn only_files_are_wanted() {
    let mut r: Replies<()> = Replies::new(0, false);
    r.offered(1, vec![dir("d"), file("d/f", 2)]);
    let want = pb::Want {
        offer_id: 1,
        entries: vec![answer(false, 5), answer(false, 6)],
    };
    assert_eq!(
        r.on_want(want).unwrap(),
        vec![Wanted::Small {
            file_id: 6,
            entry: file("d/f", 2)
        }]
    );
}

#[test]
fn a_large_file_is_wanted_by_block_set_checked_against_its_size() {
    let mut r: Replies<()> = Replies::new(0, false);
    let size = 3 * BLOCK;
    r.offered(1, vec![file("big", size)]);
    let (need_blocks, need_ranges) = set(&[0, 2]).to_want(3);
    let want = pb::Want {
        offer_id: 1,
        entries: vec![pb::EntryWant {
            file_id: 4,
            need_blocks,
            need_ranges,
            ..Default::default()
        }],
    };
    assert_eq!(
        r.on_want(want).unwrap(),
        vec![Wanted::Large {
            file_id: 4,
            entry: file("big", size),
            need: set(&[0, 2]),
        }]
    );
    // A block past the end of the file is refused.
    r.offered(2, vec![file("big2", size)]);
    let want = pb::Want {
        offer_id: 2,
        entries: vec![pb::EntryWant {
            file_id: 5,
            need_ranges: vec![0, 9],
            ..Default::default()
        }],
    };
    assert!(matches!(
        r.on_want(want),
        Err(ReceiverViolation::NeedSet { offer_id: 2, .. })
    ));
}

#[test]
fn a_dry_run_receiver_may_not_ask_for_data() {
    let mut r: Replies<()> = Replies::new(0, true);
    r.offered(1, vec![file("a", 1)]);
    let want = pb::Want {
        offer_id: 1,
        entries: vec![answer(false, 1)],
    };
    assert_eq!(
        r.on_want(want),
        Err(ReceiverViolation::DataInDryRun("a".into()))
    );
}

#[test]
fn need_blocks_answer_announces_in_order_by_bitmap() {
    let mut r = Replies::new(1, false);
    let size = 2 * BLOCK + 10;
    r.announced(Announced {
        file_id: 7,
        size,
        indexes: vec![0, 1, 2],
        file: "f7",
    });
    r.announced(Announced {
        file_id: 8,
        size,
        indexes: vec![1],
        file: "f8",
    });
    assert!(!r.settled());
    assert_eq!(
        r.on_need_blocks(&pb::NeedBlocks {
            file_id: 8,
            need_blocks: vec![]
        })
        .unwrap_err(),
        ReceiverViolation::NeedBlocksFor {
            got: 8,
            expected: 7
        }
    );
    let n = r
        .on_need_blocks(&pb::NeedBlocks {
            file_id: 8,
            need_blocks: vec![0b1],
        })
        .unwrap();
    assert_eq!(
        (n.announced.file, n.send, n.taken_bytes),
        ("f8", vec![1], 0)
    );
    assert!(r.settled());
    assert!(matches!(
        r.on_need_blocks(&pb::NeedBlocks::default()),
        Err(ReceiverViolation::Unexpected {
            stream: 1,
            kind: FrameType::NeedBlocks,
            ..
        })
    ));
}

#[test]
fn blocks_not_needed_count_as_taken() {
    let mut r = Replies::new(0, false);
    let size = 2 * BLOCK + 10;
    r.announced(Announced {
        file_id: 1,
        size,
        indexes: vec![0, 2],
        file: (),
    });
    let n = r
        .on_need_blocks(&pb::NeedBlocks {
            file_id: 1,
            need_blocks: vec![0b01],
        })
        .unwrap();
    // Block 0 is sent; the 10-byte block 2 was taken.
    assert_eq!((n.send, n.taken_bytes), (vec![0], 10));
}

#[test]
fn without_a_block_store_needed_blocks_go_over_the_wire() {
    let p = plan_large(4 * BLOCK, &set(&[1, 2]), false, false);
    assert_eq!(p.send, set(&[1, 2]));
    assert!(p.announce.is_empty());
    assert_eq!(p.held, set(&[0, 3]));
}

#[test]
fn with_a_block_store_full_blocks_are_announced_and_a_short_tail_travels() {
    let p = plan_large(3 * BLOCK + 1, &set(&[0, 1, 3]), true, false);
    assert_eq!(p.announce, set(&[0, 1]));
    assert_eq!(p.send, set(&[3]));
    assert_eq!(p.held, set(&[2]));
    // A file of full blocks announces every needed one.
    let p = plan_large(2 * BLOCK, &set(&[0, 1]), true, false);
    assert_eq!((p.announce, p.send), (set(&[0, 1]), BlockSet::new()));
    // A tail the receiver holds is not sent.
    let p = plan_large(BLOCK + 1, &set(&[0]), true, false);
    assert_eq!(
        (p.announce, p.send, p.held),
        (set(&[0]), BlockSet::new(), set(&[1]))
    );
}

#[test]
fn in_a_fan_out_a_tail_of_at_least_1_mib_is_announced_and_a_shorter_one_travels() {
    let mib = 1 << 20;
    // A long tail is announced like a full block.
    let p = plan_large(2 * BLOCK + mib, &set(&[0, 1, 2]), true, true);
    assert_eq!((p.announce, p.send), (set(&[0, 1, 2]), BlockSet::new()));
    // A file of one short block (over the small-file limit) is announced whole.
    let p = plan_large(3 * mib, &set(&[0]), true, true);
    assert_eq!((p.announce, p.send), (set(&[0]), BlockSet::new()));
    // A tail one byte short of 1 MiB still travels.
    let p = plan_large(BLOCK + mib - 1, &set(&[0, 1]), true, true);
    assert_eq!((p.announce, p.send), (set(&[0]), set(&[1])));
    // Without a store nothing is announced, tails or not.
    let p = plan_large(BLOCK + mib, &set(&[0, 1]), false, true);
    assert_eq!((p.announce, p.send), (BlockSet::new(), set(&[0, 1])));
}

#[test]
fn the_unexpected_frame_names_what_was_expected() {
    let mut r: Replies<()> = Replies::new(2, false);
    r.offered(1, vec![]);
    assert_eq!(
        r.unexpected(FrameType::Summary),
        ReceiverViolation::Unexpected {
            stream: 2,
            kind: FrameType::Summary,
            expected: "Want"
        }
    );
    r.announced(Announced {
        file_id: 1,
        size: 1,
        indexes: vec![],
        file: (),
    });
    assert!(matches!(
        r.unexpected(FrameType::Summary),
        ReceiverViolation::Unexpected {
            expected: "Want or NeedBlocks",
            ..
        }
    ));
}
