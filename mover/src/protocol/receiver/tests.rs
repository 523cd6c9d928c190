//! One test per rule of the receiver's state, in memory.

use super::*;

fn p(s: &str) -> PeerPath {
    PeerPath::parse(s.as_bytes()).unwrap()
}

type St = ReceiverState<&'static str, &'static str>;

const MIB: u64 = 1024 * 1024;
const BLOCK: u64 = BLOCK_SIZE as u64;

fn bf(file_id: u64, raw_len: u32, stored_len: u32) -> pb::BatchFile {
    pb::BatchFile {
        file_id,
        raw_len,
        stored_len,
        codec: 0,
        hash: vec![0; 32],
    }
}

fn block(file_id: u64, index: u64, raw_len: u64) -> pb::BlockHeader {
    pb::BlockHeader {
        file_id,
        index,
        raw_len: raw_len as u32,
        codec: 0,
        hash: vec![0; 32],
    }
}

fn announce(file_id: u64, indexes: &[u64]) -> pb::BlockAnnounce {
    pb::BlockAnnounce {
        file_id,
        indexes: indexes.to_vec(),
        hashes: vec![vec![1; 32]; indexes.len()],
        proofs: vec![vec![2; 32]; indexes.len()],
    }
}

/// A state with one large file of `blocks` full blocks plus a 1-byte tail, nothing held.
fn with_large(blocks: u64) -> (St, u64) {
    let mut st = St::default();
    let (id, need) = st
        .want_large(p("big"), blocks * BLOCK + 1, BlockSet::new(), "big")
        .unwrap();
    assert_eq!(need.len(), blocks + 1);
    (st, id)
}

#[test]
fn a_path_is_in_flight_once() {
    let mut st = St::default();
    st.want_small(p("a"), 10, "x").unwrap();
    assert_eq!(
        st.want_small(p("a"), 10, "x"),
        Err(SenderViolation::Duplicate("a".into()))
    );
    assert!(matches!(
        st.want_large(p("a"), 10 * MIB, BlockSet::new(), "x"),
        Err(SenderViolation::Duplicate(_))
    ));
    assert_eq!(st.in_flight(), 1);
}

#[test]
fn ids_are_fresh_and_never_reused() {
    let mut st = St::default();
    let a = st.want_small(p("a"), 1, "x").unwrap();
    st.claim_batch(vec![bf(a, 1, 1)], 1).unwrap();
    let b = st.want_small(p("a"), 1, "x").unwrap();
    assert_ne!(a, b);
    // The old id is gone: a batch naming it again is refused.
    assert_eq!(
        st.claim_batch(vec![bf(a, 1, 1)], 1).unwrap_err(),
        SenderViolation::UnknownFile {
            frame: "batch",
            id: a
        }
    );
}

#[test]
fn offers_and_sizes_are_bounded() {
    assert!(St::check_offer(MAX_OFFER_ENTRIES).is_ok());
    assert_eq!(
        St::check_offer(MAX_OFFER_ENTRIES + 1),
        Err(SenderViolation::OfferTooLarge(MAX_OFFER_ENTRIES + 1))
    );
    let st = St::default();
    assert!(matches!(
        st.check_file(&p("x"), MAX_FILE_SIZE + 1),
        Err(SenderViolation::FileTooLarge { .. })
    ));
}

#[test]
fn large_files_in_flight_are_bounded() {
    let mut st = St::default();
    for i in 0..MAX_LARGE_IN_FLIGHT {
        st.want_large(p(&format!("f{i}")), 2 * MIB, BlockSet::new(), "x")
            .unwrap();
    }
    assert_eq!(
        st.want_large(p("one-more"), 2 * MIB, BlockSet::new(), "x"),
        Err(SenderViolation::TooManyLarge)
    );
    // Small files still fit.
    st.want_small(p("small"), 1, "x").unwrap();
}

#[test]
fn a_batch_must_tile_its_frame_and_match_its_offers() {
    let mut st = St::default();
    let a = st.want_small(p("a"), 3, "a").unwrap();
    let b = st.want_small(p("b"), 2, "b").unwrap();
    let (big, _) = st
        .want_large(p("big"), 2 * MIB, BlockSet::new(), "big")
        .unwrap();
    assert_eq!(
        st.claim_batch(vec![bf(a, 3, 3), bf(b, 2, 2)], 4)
            .unwrap_err(),
        SenderViolation::BatchOverrun
    );
    assert_eq!(
        st.claim_batch(vec![bf(a, 3, 3)], 4).unwrap_err(),
        SenderViolation::BatchTrailing
    );
    assert!(matches!(
        st.claim_batch(vec![bf(a, 4, 3)], 3).unwrap_err(),
        SenderViolation::BatchLength {
            got: 4,
            offered: 3,
            ..
        }
    ));
    assert!(matches!(
        st.claim_batch(vec![bf(big, 1, 1)], 1).unwrap_err(),
        SenderViolation::WrongFileKind { what: "large", .. }
    ));
    assert!(matches!(
        st.claim_batch(vec![bf(a, 3, 3), bf(a, 3, 3)], 6)
            .unwrap_err(),
        SenderViolation::UnknownFile { .. }
    ));
    // Refusals claimed nothing: the good batch still goes through, with each file's range.
    let claimed = st.claim_batch(vec![bf(a, 3, 1), bf(b, 2, 2)], 3).unwrap();
    let got: Vec<_> = claimed.iter().map(|c| (c.file, c.range.clone())).collect();
    assert_eq!(got, vec![("a", 0..1), ("b", 1..3)]);
    assert!(matches!(
        st.claim_batch(vec![bf(a, 3, 3)], 3).unwrap_err(),
        SenderViolation::UnknownFile { .. }
    ));
    assert_eq!(st.in_flight(), 1);
}

#[test]
fn blocks_must_be_in_range_of_the_right_length_and_requested_once() {
    let (mut st, id) = with_large(2);
    assert!(matches!(
        st.claim_block(&block(id, 3, 1)).unwrap_err(),
        SenderViolation::BlockIndex {
            index: 3,
            last: 2,
            ..
        }
    ));
    assert!(matches!(
        st.claim_block(&block(id, 2, 2)).unwrap_err(),
        SenderViolation::BlockLength {
            got: 2,
            expected: 1,
            ..
        }
    ));
    assert!(matches!(
        st.claim_block(&block(id + 1, 0, BLOCK)).unwrap_err(),
        SenderViolation::UnknownFile { .. }
    ));
    let small = st.want_small(p("s"), 1, "s").unwrap();
    assert!(matches!(
        st.claim_block(&block(small, 0, 1)).unwrap_err(),
        SenderViolation::WrongFileKind { what: "small", .. }
    ));
    let c = st.claim_block(&block(id, 2, 1)).unwrap();
    assert_eq!((c.file, c.len, c.size), ("big", 1, 2 * BLOCK + 1));
    assert!(matches!(
        st.claim_block(&block(id, 2, 1)).unwrap_err(),
        SenderViolation::NotRequested { index: 2, .. }
    ));
}

#[test]
fn a_large_file_commits_when_its_last_block_is_written() {
    let (mut st, id) = with_large(2);
    for i in [1, 0, 2] {
        st.claim_block(&block(id, i, block_len(2 * BLOCK + 1, i)))
            .unwrap();
    }
    assert_eq!(st.blocks_written(id, 1), Ok(None));
    assert_eq!(st.blocks_written(id, 1), Ok(None));
    assert!(st.check_finished().is_err());
    assert_eq!(st.blocks_written(id, 1), Ok(Some("big")));
    // Gone: nothing more can be written to it, and the session may finish.
    assert!(matches!(
        st.blocks_written(id, 1),
        Err(SenderViolation::UnknownFile { .. })
    ));
    assert_eq!(st.check_finished(), Ok(()));
    // Its path may be offered again (a later rerun within one receiver).
    st.want_small(p("big"), 1, "again").unwrap();
}

#[test]
fn more_blocks_written_than_claimed_never_commits() {
    let (mut st, id) = with_large(1);
    assert!(st.blocks_written(id, 5).is_err());
}

#[test]
fn finishing_with_files_in_flight_is_refused() {
    let mut st = St::default();
    st.want_small(p("dir/left"), 5, "x").unwrap();
    assert_eq!(
        st.check_finished(),
        Err(SenderViolation::Incomplete {
            count: 1,
            example: "dir/left".into()
        })
    );
}

#[test]
fn held_blocks_are_not_requested_until_the_sender_confirms_them() {
    let mut st = St::default();
    let mut held = BlockSet::new();
    held.insert_range(0, 2);
    let (id, need) = st.want_large(p("r"), 4 * BLOCK, held, "r").unwrap();
    assert_eq!(need.iter().collect::<Vec<_>>(), vec![2, 3]);
    // A held block is not requested: sending it is a violation.
    assert!(matches!(
        st.claim_block(&block(id, 0, BLOCK)).unwrap_err(),
        SenderViolation::NotRequested { index: 0, .. }
    ));
    // Only held blocks may be checked, each once.
    let check = |indexes: &[u64]| pb::ResumeCheck {
        file_id: id,
        indexes: indexes.to_vec(),
        hashes: vec![vec![7; 32]; indexes.len()],
    };
    assert!(matches!(
        st.claim_resume(&check(&[2])).unwrap_err(),
        SenderViolation::NotHeld { index: 2, .. }
    ));
    let c = st.claim_resume(&check(&[0, 1])).unwrap();
    assert_eq!(c.hashes, vec![[7; 32]; 2]);
    assert!(matches!(
        st.claim_resume(&check(&[0])).unwrap_err(),
        SenderViolation::NotHeld { .. }
    ));
    // Block 1 did not match: it is requested again and comes over the wire.
    st.need_again(id, [1]).unwrap();
    assert_eq!(st.blocks_written(id, 1), Ok(None)); // block 0 kept
    for i in [1, 2, 3] {
        st.claim_block(&block(id, i, BLOCK)).unwrap();
    }
    assert_eq!(st.blocks_written(id, 3), Ok(Some("r")));
}

#[test]
fn a_resume_check_is_well_formed() {
    let mut st = St::default();
    let mut held = BlockSet::new();
    held.insert(0);
    let (id, _) = st.want_large(p("r"), 2 * BLOCK, held, "x").unwrap();
    let bad_len = pb::ResumeCheck {
        file_id: id,
        indexes: vec![0],
        hashes: vec![],
    };
    assert_eq!(
        st.claim_resume(&bad_len).unwrap_err(),
        SenderViolation::ListLengths {
            frame: "ResumeCheck"
        }
    );
    let bad_hash = pb::ResumeCheck {
        file_id: id,
        indexes: vec![0],
        hashes: vec![vec![0; 31]],
    };
    assert!(matches!(
        st.claim_resume(&bad_hash).unwrap_err(),
        SenderViolation::MalformedResumeHash { .. }
    ));
    // Nothing was claimed by the refusals.
    let good = pb::ResumeCheck {
        file_id: id,
        indexes: vec![0],
        hashes: vec![vec![0; 32]],
    };
    st.claim_resume(&good).unwrap();
}

#[test]
fn announced_blocks_are_full_requested_and_well_formed() {
    let (mut st, id) = with_large(3);
    // The 1-byte tail is not a full block: it cannot come from the store.
    assert!(matches!(
        st.claim_announce(&announce(id, &[3]), false).unwrap_err(),
        SenderViolation::NotAnnounceable { index: 3, .. }
    ));
    let mut short = announce(id, &[0]);
    short.proofs[0].pop();
    assert!(matches!(
        st.claim_announce(&short, false).unwrap_err(),
        SenderViolation::MalformedAnnounce { index: 0, .. }
    ));
    let mut uneven = announce(id, &[0, 1]);
    uneven.hashes.pop();
    assert!(matches!(
        st.claim_announce(&uneven, false).unwrap_err(),
        SenderViolation::ListLengths { .. }
    ));
    let (claimed, blocks) = st.claim_announce(&announce(id, &[0, 1]), false).unwrap();
    assert_eq!((claimed.file, claimed.len), ("big", BLOCK));
    assert_eq!(blocks.iter().map(|b| b.index).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(blocks[0].proof.0, [2; 32]);
    // Announced blocks are claimed: not again, and not as Block frames.
    assert!(st.claim_announce(&announce(id, &[1]), false).is_err());
    assert!(st.claim_block(&block(id, 0, BLOCK)).is_err());
    // The store lacked block 1: requested again, it may come as a Block.
    st.need_again(id, [1]).unwrap();
    st.claim_block(&block(id, 1, BLOCK)).unwrap();
}

#[test]
fn in_a_fan_out_a_tail_of_at_least_1_mib_may_be_announced() {
    let mib = 1 << 20;
    let mut st = St::default();
    let (long, _) = st
        .want_large(p("long"), 2 * BLOCK + mib, BlockSet::new(), "long")
        .unwrap();
    let (short, _) = st
        .want_large(p("short"), 2 * BLOCK + mib - 1, BlockSet::new(), "short")
        .unwrap();
    // Without the capability a tail is never announced.
    assert!(matches!(
        st.claim_announce(&announce(long, &[2]), false).unwrap_err(),
        SenderViolation::NotAnnounceable { index: 2, .. }
    ));
    // With it, a tail under 1 MiB still is not (it travels), and a long one is.
    assert!(matches!(
        st.claim_announce(&announce(short, &[2]), true).unwrap_err(),
        SenderViolation::NotAnnounceable { index: 2, .. }
    ));
    let (claimed, blocks) = st.claim_announce(&announce(long, &[1, 2]), true).unwrap();
    assert_eq!(claimed.file, "long");
    assert_eq!(blocks.iter().map(|b| b.index).collect::<Vec<_>>(), [1, 2]);
    // Past the end is refused whatever the capability.
    assert!(st.claim_announce(&announce(long, &[3]), true).is_err());
}

#[test]
fn an_announce_lists_a_bounded_number_of_blocks() {
    let (mut st, id) = with_large(1);
    let many: Vec<u64> = (0..MAX_ANNOUNCE_BLOCKS as u64 + 1).collect();
    assert!(matches!(
        st.claim_announce(&announce(id, &many), false).unwrap_err(),
        SenderViolation::TooManyBlocks { .. }
    ));
}

#[test]
fn scattered_blocks_are_refused_before_the_bookkeeping_grows() {
    let n = 2 * MAX_FILE_RANGES as u64 + 4;
    let mut st = St::default();
    let (id, _) = st
        .want_large(p("s"), n * BLOCK, BlockSet::new(), "x")
        .unwrap();
    // Taking every other block splits the need set into one more range each time.
    let mut refused = None;
    for i in (1..n).step_by(2) {
        if let Err(e) = st.claim_block(&block(id, i, BLOCK)) {
            refused = Some(e);
            break;
        }
    }
    assert!(matches!(refused, Some(SenderViolation::Scattered { .. })));
}

#[test]
fn a_data_stream_sends_data_then_done() {
    let mut s = StreamRules::new(1, false, false);
    assert_eq!(s.route(FrameType::Offer), Ok(Route::Offer));
    assert_eq!(s.route(FrameType::Block), Ok(Route::Data));
    assert_eq!(s.route(FrameType::Batch), Ok(Route::Data));
    assert_eq!(s.route(FrameType::Busy), Ok(Route::Alive));
    assert!(matches!(
        s.route(FrameType::DirDone),
        Err(SenderViolation::OutOfOrder {
            stream: 1,
            when: "while data flows",
            ..
        })
    ));
    assert_eq!(s.route(FrameType::Done), Ok(Route::Done));
    // Only stream 0 closes the session.
    assert!(s.route(FrameType::DirDone).is_err());
    assert!(s.route(FrameType::Finish).is_err());
}

#[test]
fn stream_zero_closes_with_directories_then_finish() {
    let mut s = StreamRules::new(0, true, true);
    assert_eq!(s.route(FrameType::BlockAnnounce), Ok(Route::Announce));
    assert_eq!(s.route(FrameType::ResumeCheck), Ok(Route::ResumeCheck));
    assert!(s.route(FrameType::Finish).is_err());
    assert_eq!(s.route(FrameType::Done), Ok(Route::Done));
    // Hard links are offered after Done; data is not.
    assert_eq!(s.route(FrameType::Offer), Ok(Route::Offer));
    assert!(matches!(
        s.route(FrameType::Block),
        Err(SenderViolation::OutOfOrder {
            when: "after Done",
            ..
        })
    ));
    assert_eq!(s.route(FrameType::DirDone), Ok(Route::DirDone));
    assert_eq!(s.route(FrameType::Error), Ok(Route::PeerError));
    assert_eq!(s.route(FrameType::Finish), Ok(Route::Finish));
    assert!(s.route(FrameType::Keepalive).is_err());
}

#[test]
fn announces_and_resume_checks_need_their_capability() {
    let mut s = StreamRules::new(0, false, false);
    assert_eq!(
        s.route(FrameType::BlockAnnounce),
        Err(SenderViolation::NotNegotiated(FrameType::BlockAnnounce))
    );
    assert_eq!(
        s.route(FrameType::ResumeCheck),
        Err(SenderViolation::NotNegotiated(FrameType::ResumeCheck))
    );
    // Frames only a receiver sends are out of order from a sender.
    assert!(s.route(FrameType::Want).is_err());
    assert!(s.route(FrameType::Summary).is_err());
}

#[test]
fn listings_and_attributes_are_checked() {
    assert!(check_listing(vec![b"a".to_vec(), b"b c".to_vec()]).is_ok());
    for bad in [&b""[..], b".", b"..", b"a/b"] {
        assert!(check_listing(vec![bad.to_vec()]).is_err(), "{bad:?}");
    }
    let x = |name: &[u8], value: usize| pb::Xattr {
        name: name.to_vec(),
        value: vec![0; value],
    };
    assert_eq!(check_xattrs(&p("f"), &[x(b"user.a", 4)], 100), Ok(10));
    // `user.` alone names nothing; thousands of tiny ones are refused by count.
    assert!(matches!(
        check_xattrs(&p("f"), &[x(b"user.", 1)], 100),
        Err(SenderViolation::XattrName { .. })
    ));
    let many: Vec<pb::Xattr> = (0..=MAX_XATTRS_PER_ENTRY)
        .map(|_| x(b"user.a", 0))
        .collect();
    assert!(matches!(
        check_xattrs(&p("f"), &many, 1 << 20),
        Err(SenderViolation::XattrCount { .. })
    ));
    assert!(matches!(
        check_xattrs(&p("f"), &[x(b"security.capability", 4)], 100),
        Err(SenderViolation::XattrName { .. })
    ));
    assert!(matches!(
        check_xattrs(&p("f"), &[x(b"user.a", 95)], 100),
        Err(SenderViolation::XattrSize { total: 101, .. })
    ));
    assert!(check_link_target(&p("l"), b"../t").is_ok());
    for bad in [&b""[..], b"a\0b"] {
        assert!(check_link_target(&p("l"), bad).is_err());
    }
    assert!(check_link_target(&p("l"), &vec![b'a'; MAX_LINK_TARGET + 1]).is_err());
}

fn pack_announce(file_ids: &[u64]) -> pb::PackAnnounce {
    pb::PackAnnounce {
        file_ids: file_ids.to_vec(),
        hash: vec![7; 32],
        proof: vec![8; 32],
    }
}

fn pack_header(pack_id: u64, raw_len: u64, hash: u8) -> pb::PackHeader {
    pb::PackHeader {
        pack_id,
        raw_len: raw_len as u32,
        codec: 0,
        hash: vec![hash; 32],
    }
}

/// A state with `n` small files of `size` bytes each asked for; their ids.
fn with_small(n: usize, size: u64) -> (St, Vec<u64>) {
    let mut st = St::default();
    let ids = (0..n)
        .map(|i| st.want_small(p(&format!("f{i}")), size, "x").unwrap())
        .collect();
    (st, ids)
}

#[test]
fn a_pack_names_small_files_in_flight_whose_bytes_a_store_keeps() {
    let (mut st, ids) = with_small(4, MIB / 2);
    // 2 MiB of files: a pack, named by its first file.
    let claimed = st.claim_pack(&pack_announce(&ids)).unwrap();
    assert_eq!(claimed.pack_id, ids[0]);
    assert_eq!(claimed.len, 2 * MIB);
    assert_eq!(claimed.paths, vec![p("f0"), p("f1"), p("f2"), p("f3")]);
    assert_eq!(claimed.announced.hash.as_bytes(), &[7; 32]);
    assert_eq!(st.packed_files(), 4);
    // Its files no longer come in a batch, nor in another pack.
    assert_eq!(
        st.claim_batch(
            vec![bf(ids[1], (MIB / 2) as u32, (MIB / 2) as u32)],
            (MIB / 2) as usize
        )
        .unwrap_err(),
        SenderViolation::WrongFileKind {
            frame: "batch",
            what: "packed",
            id: ids[1]
        }
    );
    assert!(matches!(
        st.claim_pack(&pack_announce(&ids[1..])),
        Err(SenderViolation::WrongFileKind {
            frame: "PackAnnounce",
            what: "packed",
            ..
        })
    ));
    // Still in flight until their bytes come: a session cannot finish without them.
    assert!(matches!(
        st.check_finished(),
        Err(SenderViolation::Incomplete { count: 4, .. })
    ));
}

#[test]
fn a_pack_outside_what_a_store_keeps_or_malformed_claims_nothing() {
    let (mut st, ids) = with_small(10, MIB / 2);
    // Under 1 MiB, over 4 MiB, no file, an unknown id, a file named twice.
    assert_eq!(
        st.claim_pack(&pack_announce(&ids[..1])).unwrap_err(),
        SenderViolation::PackSize { len: MIB / 2 }
    );
    assert_eq!(
        st.claim_pack(&pack_announce(&ids[..9])).unwrap_err(),
        SenderViolation::PackSize { len: 9 * MIB / 2 }
    );
    assert_eq!(
        st.claim_pack(&pack_announce(&[])).unwrap_err(),
        SenderViolation::PackFiles(0)
    );
    assert!(matches!(
        st.claim_pack(&pack_announce(&[ids[0], 999])),
        Err(SenderViolation::UnknownFile {
            frame: "PackAnnounce",
            id: 999
        })
    ));
    assert_eq!(
        st.claim_pack(&pack_announce(&[ids[0], ids[1], ids[0]]))
            .unwrap_err(),
        SenderViolation::Duplicate("f0".into())
    );
    let mut short = pack_announce(&ids[..4]);
    short.proof.pop();
    assert!(matches!(
        st.claim_pack(&short),
        Err(SenderViolation::MalformedPack { .. })
    ));
    // None of that claimed anything: the files still come in a batch.
    assert_eq!(st.packed_files(), 0);
    let half = (MIB / 2) as u32;
    st.claim_batch(vec![bf(ids[0], half, half)], half as usize)
        .unwrap();
    // A large file is no part of a pack.
    let (big, _) = st
        .want_large(p("big"), 2 * MIB, BlockSet::new(), "big")
        .unwrap();
    assert!(matches!(
        st.claim_pack(&pack_announce(&[ids[1], big])),
        Err(SenderViolation::WrongFileKind { what: "large", .. })
    ));
}

#[test]
fn a_pack_frame_comes_only_when_asked_for_and_as_announced() {
    let (mut st, ids) = with_small(3, MIB);
    let claimed = st.claim_pack(&pack_announce(&ids)).unwrap();
    let id = claimed.pack_id;
    // Not asked for (the receiver took it from a store, or leaves it to a fellow destination).
    assert_eq!(
        st.claim_pack_data(&pack_header(id, 3 * MIB, 7))
            .unwrap_err(),
        SenderViolation::UnknownPack(id)
    );
    st.pack_on_wire(id).unwrap();
    assert_eq!(
        st.pack_on_wire(id).unwrap_err(),
        SenderViolation::UnknownPack(id),
        "asked once"
    );
    // Another length or another hash than announced.
    assert!(matches!(
        st.claim_pack_data(&pack_header(id, 3 * MIB - 1, 7)),
        Err(SenderViolation::PackMismatch { .. })
    ));
    assert!(matches!(
        st.claim_pack_data(&pack_header(id, 3 * MIB, 6)),
        Err(SenderViolation::PackMismatch { .. })
    ));
    // Asked for, it comes once: the files in the pack's order, out of flight.
    let files = st.claim_pack_data(&pack_header(id, 3 * MIB, 7)).unwrap();
    let paths: Vec<_> = files.iter().map(|f| (f.path.clone(), f.size)).collect();
    assert_eq!(paths, vec![(p("f0"), MIB), (p("f1"), MIB), (p("f2"), MIB)]);
    assert_eq!(st.in_flight(), 0);
    assert_eq!(st.packed_files(), 0);
    st.check_finished().unwrap();
    assert_eq!(
        st.claim_pack_data(&pack_header(id, 3 * MIB, 7))
            .unwrap_err(),
        SenderViolation::UnknownPack(id)
    );
    // Their paths may be offered again (they then find the files).
    st.want_small(p("f0"), MIB, "x").unwrap();
}

#[test]
fn a_pack_a_store_handed_over_is_taken_once_and_not_from_the_wire() {
    let (mut st, ids) = with_small(2, MIB);
    let id = st.claim_pack(&pack_announce(&ids)).unwrap().pack_id;
    assert_eq!(st.take_pack(id).unwrap().len(), 2);
    assert_eq!(
        st.take_pack(id).unwrap_err(),
        SenderViolation::UnknownPack(id)
    );
    assert_eq!(
        st.pack_on_wire(id).unwrap_err(),
        SenderViolation::UnknownPack(id)
    );
    // Once asked of the sender, a late store copy is not taken (the wire's is).
    let (mut st, ids) = with_small(2, MIB);
    let id = st.claim_pack(&pack_announce(&ids)).unwrap().pack_id;
    st.pack_on_wire(id).unwrap();
    assert_eq!(
        st.take_pack(id).unwrap_err(),
        SenderViolation::UnknownPack(id)
    );
    assert_eq!(
        st.claim_pack_data(&pack_header(id, 2 * MIB, 7))
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn packs_come_only_with_the_capability_and_the_store() {
    let mut plain = StreamRules::new(0, true, true);
    assert_eq!(
        plain.route(FrameType::PackAnnounce),
        Err(SenderViolation::NotNegotiated(FrameType::PackAnnounce))
    );
    assert_eq!(
        plain.route(FrameType::Pack),
        Err(SenderViolation::NotNegotiated(FrameType::Pack))
    );
    let mut no_store = StreamRules::new(0, false, true).with_packs(true);
    assert!(no_store.route(FrameType::PackAnnounce).is_err());
    let mut fan_out = StreamRules::new(0, true, true).with_packs(true);
    assert_eq!(
        fan_out.route(FrameType::PackAnnounce),
        Ok(Route::PackAnnounce)
    );
    assert_eq!(fan_out.route(FrameType::Pack), Ok(Route::Data));
}
