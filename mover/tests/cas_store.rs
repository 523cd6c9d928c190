//! Block store integration tests on real files: round trips, corruption, LRU and leases, proof of
//! possession, concurrency across threads and processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ferry_mover::cas::dedup::{DedupReceiver, DedupSender};
use ferry_mover::cas::pop::{self, PopKey, Proof};
use ferry_mover::cas::{BLOCK_SIZE, BlockHash, CasError, CasStore, InsertOutcome};

/// Deterministic pseudo-random bytes (xorshift), different per seed.
fn block(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn set_last_used(store: &CasStore, h: &BlockHash, secs_ago: u64) {
    let f = File::open(store.block_path(h)).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(secs_ago))
        .unwrap();
}

fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn insert_lookup_read_copy_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = CasStore::open(dir.path(), 1 << 30).unwrap();
    let big = block(1, BLOCK_SIZE);
    let small = block(2, 1000);
    let hb = BlockHash::of(&big);
    let hs = BlockHash::of(&small);
    assert!(store.lookup(&hb).unwrap().is_none());
    assert_eq!(store.insert(&hb, &big).unwrap(), InsertOutcome::Inserted);
    assert_eq!(store.insert(&hs, &small).unwrap(), InsertOutcome::Inserted);
    assert_eq!(
        store.insert(&hb, &big).unwrap(),
        InsertOutcome::AlreadyPresent
    );

    let r = store.lookup(&hb).unwrap().unwrap();
    assert_eq!(r.len, BLOCK_SIZE as u64);
    let hex = hb.to_hex();
    let expect_path = dir
        .path()
        .join("blocks")
        .join(&hex[..2])
        .join(&hex[2..4])
        .join(&hex);
    assert!(expect_path.is_file(), "sharded layout blocks/ab/cd/<hash>");
    assert_eq!(store.read_verified(&hb).unwrap().unwrap(), big);
    assert_eq!(store.read_verified(&hs).unwrap().unwrap(), small);

    // copy_into writes the verified bytes at the offset of a real destination file.
    let dst_dir = tempfile::tempdir().unwrap();
    let dst_path = dst_dir.path().join("dst");
    let dst = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&dst_path)
        .unwrap();
    assert_eq!(
        store.copy_into(&hb, &dst, 4096).unwrap(),
        Some(BLOCK_SIZE as u64)
    );
    let mut back = vec![0u8; BLOCK_SIZE];
    dst.read_exact_at(&mut back, 4096).unwrap();
    assert_eq!(back, big);

    // Absent hash: nothing.
    let absent = BlockHash::of(b"never stored");
    assert!(store.read_verified(&absent).unwrap().is_none());
    assert!(store.copy_into(&absent, &dst, 0).unwrap().is_none());

    // Nothing left behind in tmp/.
    assert!(files_under(&dir.path().join("tmp")).is_empty());
    // Stats agree.
    let s = store.stats().unwrap();
    assert_eq!((s.blocks, s.bytes), (2, BLOCK_SIZE as u64 + 1000));
    assert_eq!(s.cap_bytes, Some(1 << 30));
}

#[test]
fn insert_rechecks_the_hash_and_the_size() {
    let dir = tempfile::tempdir().unwrap();
    let store = CasStore::open(dir.path(), 1 << 30).unwrap();
    let data = block(3, 5000);
    let wrong = BlockHash::of(b"something else");
    match store.insert(&wrong, &data) {
        Err(CasError::HashMismatch { expected, actual }) => {
            assert_eq!(expected, wrong);
            assert_eq!(actual, BlockHash::of(&data));
        }
        other => panic!("expected HashMismatch, got {other:?}"),
    }
    assert!(store.lookup(&wrong).unwrap().is_none());
    assert!(store.lookup(&BlockHash::of(&data)).unwrap().is_none());
    let too_big = vec![0u8; BLOCK_SIZE + 1];
    assert!(matches!(
        store.insert(&BlockHash::of(&too_big), &too_big),
        Err(CasError::BlockTooLarge { .. })
    ));
    assert!(files_under(&dir.path().join("blocks")).is_empty());
    assert!(files_under(&dir.path().join("tmp")).is_empty());
}

#[test]
fn refuses_to_adopt_a_foreign_directory() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("precious.txt"), b"user data").unwrap();
    assert!(matches!(
        CasStore::open(dir.path(), 1 << 20),
        Err(CasError::NotAStore { .. })
    ));
    assert_eq!(
        fs::read(dir.path().join("precious.txt")).unwrap(),
        b"user data"
    );
}

#[test]
fn flipped_byte_is_detected_on_read_and_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let store = CasStore::open(dir.path(), 1 << 30).unwrap();
    let data = block(4, BLOCK_SIZE);
    let h = BlockHash::of(&data);
    store.insert(&h, &data).unwrap();
    let path = store.block_path(&h);
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[data[777] ^ 0x40], 777).unwrap();
    drop(f);

    assert!(
        store.read_verified(&h).unwrap().is_none(),
        "bad block served"
    );
    assert!(!path.exists(), "bad block must be discarded");
    assert_eq!(store.corrupt_discarded(), 1);
    // Refetched and re-inserted, it is good again.
    assert_eq!(store.insert(&h, &data).unwrap(), InsertOutcome::Inserted);
    assert_eq!(store.read_verified(&h).unwrap().unwrap(), data);
}

#[test]
fn truncated_block_is_detected_by_verify_all() {
    let dir = tempfile::tempdir().unwrap();
    let store = CasStore::open(dir.path(), 1 << 30).unwrap();
    let good = block(5, 100_000);
    let bad = block(6, 100_000);
    let (hg, hb) = (BlockHash::of(&good), BlockHash::of(&bad));
    store.insert(&hg, &good).unwrap();
    store.insert(&hb, &bad).unwrap();
    // What a crash without --sync can leave: the name published, the content lost.
    OpenOptions::new()
        .write(true)
        .open(store.block_path(&hb))
        .unwrap()
        .set_len(4096)
        .unwrap();
    let r = store.verify_all().unwrap();
    assert_eq!(r.blocks_checked, 2);
    assert_eq!(r.bad_blocks_discarded, 1);
    assert_eq!(r.bad_hashes, vec![hb.to_hex()]);
    assert!(store.lookup(&hb).unwrap().is_none());
    assert!(store.lookup(&hg).unwrap().is_some());
}

#[test]
fn lru_eviction_respects_reads_and_leases() {
    let dir = tempfile::tempdir().unwrap();
    let len = 64 * 1024;
    let store = CasStore::open(dir.path(), 1 << 40).unwrap();
    let blocks: Vec<Vec<u8>> = (0..8).map(|i| block(100 + i, len)).collect();
    let hashes: Vec<BlockHash> = blocks.iter().map(|b| BlockHash::of(b)).collect();
    for (i, (h, b)) in hashes.iter().zip(&blocks).enumerate() {
        store.insert(h, b).unwrap();
        // Block 0 is the least recently used, block 7 the most.
        set_last_used(&store, h, 1000 - i as u64 * 10);
    }
    // Reading block 2 makes it the most recently used.
    assert!(store.read_verified(&hashes[2]).unwrap().is_some());
    // A live lease pins blocks 0 and 1 (the oldest).
    let lease = store.lease("transfer-a").unwrap();
    lease.pin(&hashes[0..2]).unwrap();

    let r = store.gc(Some(4 * len as u64)).unwrap();
    assert!(r.reached_target, "{r:?}");
    assert_eq!(r.blocks_evicted, 4);
    assert_eq!(r.bytes_after, 4 * len as u64);
    let present: Vec<bool> = hashes
        .iter()
        .map(|h| store.lookup(h).unwrap().is_some())
        .collect();
    // Pinned 0,1 stay; unpinned LRU 3,4,5,6 go; 7 and the just-read 2 stay.
    assert_eq!(
        present,
        vec![true, true, true, false, false, false, false, true]
    );

    // Everything pinned: gc cannot reach the target and says so, deleting nothing pinned.
    lease.pin(&[hashes[2], hashes[7]]).unwrap();
    let r = store.gc(Some(0)).unwrap();
    assert!(!r.reached_target);
    assert_eq!(r.blocks_evicted, 0);
    assert_eq!(r.live_leases, 1);

    // Lease released: the pins are gone and the oldest go first.
    drop(lease);
    let r = store.gc(Some(2 * len as u64)).unwrap();
    assert_eq!(r.blocks_evicted, 2);
    assert!(store.lookup(&hashes[0]).unwrap().is_none());
    assert!(store.lookup(&hashes[1]).unwrap().is_none());
    assert!(store.lookup(&hashes[2]).unwrap().is_some());
    assert!(store.lookup(&hashes[7]).unwrap().is_some());
}

#[test]
fn a_lease_whose_holder_died_expires() {
    let dir = tempfile::tempdir().unwrap();
    let store = CasStore::open(dir.path(), 1 << 40).unwrap();
    let data = block(7, 10_000);
    let h = BlockHash::of(&data);
    store.insert(&h, &data).unwrap();
    // A lease file nobody holds a lock on: what a SIGKILLed receiver leaves behind.
    let dead = dir.path().join("leases").join("dead-1-1-1.lease");
    fs::write(&dead, format!("{}\n", h.to_hex())).unwrap();
    let r = store.gc(Some(0)).unwrap();
    assert_eq!(r.expired_leases_removed, 1);
    assert_eq!(r.blocks_evicted, 1, "a dead lease must not pin anything");
    assert!(!dead.exists());
}

#[test]
fn inserts_keep_the_store_under_its_cap_but_never_evict_pinned_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let len = 64 * 1024;
    let cap = 4 * len as u64;
    let store = CasStore::open(dir.path(), cap).unwrap();
    let lease = store.lease("running-transfer").unwrap();
    let mut hashes = Vec::new();
    for i in 0..12u64 {
        let b = block(200 + i, len);
        let h = BlockHash::of(&b);
        if i < 2 {
            lease.pin(&[h]).unwrap();
        }
        store.insert(&h, &b).unwrap();
        hashes.push(h);
        let s = store.stats().unwrap();
        assert!(s.bytes <= cap, "over cap after insert {i}: {}", s.bytes);
    }
    assert!(store.lookup(&hashes[0]).unwrap().is_some());
    assert!(store.lookup(&hashes[1]).unwrap().is_some());
    assert!(
        store.lookup(&hashes[11]).unwrap().is_some(),
        "newest block kept"
    );
    assert!(
        store.lookup(&hashes[2]).unwrap().is_none(),
        "oldest unpinned block evicted"
    );
}

#[test]
fn proof_of_possession_gates_materialisation() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CasStore::open(dir.path(), 1 << 30).unwrap());
    let data = block(8, BLOCK_SIZE);
    let h = BlockHash::of(&data);
    store.insert(&h, &data).unwrap();

    let receiver = DedupReceiver::new(store.clone(), "t1").unwrap();
    let nonce = pop::challenge();
    let key = PopKey::derive(&nonce);
    let dst_dir = tempfile::tempdir().unwrap();
    let dst = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst_dir.path().join("f"))
        .unwrap();
    dst.set_len(2 * BLOCK_SIZE as u64).unwrap();

    // An attacker knows the hash but not the bytes: every kind of guess is refused.
    let attacker_guesses = [
        Proof(*h.as_bytes()),
        pop::prove(&pop::challenge(), &data), // a real proof under another nonce (replay)
        DedupSender::new(&nonce).announce(0, b"other bytes").proof,
    ];
    for proof in attacker_guesses {
        let announced = ferry_mover::cas::dedup::AnnouncedBlock {
            index: 1,
            hash: h,
            proof,
        };
        let need = receiver
            .materialize_announced(&key, &dst, &[announced])
            .unwrap();
        assert_eq!(
            need,
            vec![true],
            "a block without proof must come over the wire"
        );
    }
    let mut back = vec![0u8; BLOCK_SIZE];
    dst.read_exact_at(&mut back, BLOCK_SIZE as u64).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "nothing may be written without proof"
    );
    let c = receiver.counters();
    assert_eq!((c.dedup_blocks, c.proofs_rejected), (0, 3));

    // The real holder proves possession and gets the block from the store.
    let sender = DedupSender::new(&nonce);
    let missing = block(9, BLOCK_SIZE);
    let announced = [sender.announce(0, &missing), sender.announce(1, &data)];
    let need = receiver
        .materialize_announced(&key, &dst, &announced)
        .unwrap();
    assert_eq!(
        need,
        vec![true, false],
        "only the block the store lacks is needed"
    );
    dst.read_exact_at(&mut back, BLOCK_SIZE as u64).unwrap();
    assert_eq!(back, data);
    let c = receiver.counters();
    assert_eq!((c.dedup_blocks, c.dedup_bytes), (1, BLOCK_SIZE as u64));
    // The needed block arrives and is stored after verification; next time it hits.
    receiver
        .insert_received(&BlockHash::of(&missing), &missing)
        .unwrap();
    assert_eq!(receiver.counters().blocks_inserted, 1);
    assert!(store.lookup(&BlockHash::of(&missing)).unwrap().is_some());
}

#[test]
fn thirty_two_threads_publishing_one_block_agree() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CasStore::open(dir.path(), 1 << 30).unwrap());
    let data = Arc::new(block(10, BLOCK_SIZE));
    let h = BlockHash::of(&data);
    let outcomes: Vec<InsertOutcome> = (0..32)
        .map(|_| {
            let (store, data) = (store.clone(), data.clone());
            std::thread::spawn(move || store.insert(&h, &data).unwrap())
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let inserted = outcomes
        .iter()
        .filter(|o| **o == InsertOutcome::Inserted)
        .count();
    assert_eq!(inserted, 1, "exactly one publish wins");
    assert_eq!(store.read_verified(&h).unwrap().unwrap(), *data);
    assert!(files_under(&dir.path().join("tmp")).is_empty());
    assert_eq!(
        store.stats().unwrap().usage_counter_bytes,
        BLOCK_SIZE as u64
    );
}

#[test]
fn two_processes_insert_while_a_third_reads() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let store = CasStore::open(&store_dir, 1 << 40).unwrap();
    // Two source files sharing half their blocks.
    let blocks: Vec<Vec<u8>> = (0..9).map(|i| block(300 + i, BLOCK_SIZE)).collect();
    let a: Vec<u8> = blocks[0..6].concat();
    let b: Vec<u8> = blocks[3..9].concat();
    fs::write(dir.path().join("a"), &a).unwrap();
    fs::write(dir.path().join("b"), &b).unwrap();
    let bin = env!("CARGO_BIN_EXE_ferry-mover");
    let spawn = |f: &str| {
        Command::new(bin)
            .args(["cas", "import", "--json"])
            .arg(&store_dir)
            .arg(dir.path().join(f))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut children = vec![spawn("a"), spawn("b"), spawn("a"), spawn("b")];
    // Meanwhile this process reads whatever is already published; everything it gets is right.
    let hashes: Vec<BlockHash> = blocks.iter().map(|b| BlockHash::of(b)).collect();
    let mut served = 0;
    for _ in 0..200 {
        for (h, b) in hashes.iter().zip(&blocks) {
            if let Some(bytes) = store.read_verified(h).unwrap() {
                assert_eq!(&bytes, b);
                served += 1;
            }
        }
        if children.iter_mut().all(|c| c.try_wait().unwrap().is_some()) {
            break;
        }
    }
    for c in &mut children {
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(store.corrupt_discarded(), 0, "a reader saw a partial block");
    let s = store.stats().unwrap();
    assert_eq!(s.blocks, 9);
    assert_eq!(s.bytes, 9 * BLOCK_SIZE as u64);
    assert_eq!(s.usage_counter_bytes, 9 * BLOCK_SIZE as u64);
    assert_eq!(store.verify_all().unwrap().bad_blocks_discarded, 0);
    assert!(files_under(&store_dir.join("tmp")).is_empty());
    eprintln!("reads served while importing: {served}");
}

/// Opening a store removes temps whose writer died (unlocked ones). A writer's temp is unlocked
/// for an instant after it is created; writers racing with a stream of opens must still succeed
/// every time (leases and blocks alike).
#[test]
fn writers_survive_concurrent_opens_that_clean_temps() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let store = CasStore::open(&store_dir, 1 << 40).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cleaners: Vec<_> = (0..2)
        .map(|_| {
            let (d, stop) = (store_dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut opens = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    CasStore::open_existing(&d).unwrap();
                    opens += 1;
                }
                opens
            })
        })
        .collect();
    for i in 0..300u64 {
        let data = block(10_000 + i, 4096);
        let outcome = store.insert(&BlockHash::of(&data), &data).unwrap();
        assert_eq!(outcome, InsertOutcome::Inserted, "block {i}");
        drop(store.lease(&format!("t{i}")).unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opens: u32 = cleaners.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(opens > 0);
    assert!(files_under(&store_dir.join("tmp")).is_empty());
}

/// A FIFO or a directory under a block's name neither hangs a reader nor makes the hash
/// unstorable, and `verify` reports it.
#[test]
fn fifos_and_directories_under_block_names_are_corrupt_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(CasStore::open(tmp.path(), 1 << 30).unwrap());
    let plant = |seed: u64, fifo: bool| {
        let data = block(seed, BLOCK_SIZE);
        let hash = BlockHash::of(&data);
        let path = store.block_path(&hash);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        if fifo {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &path,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o644),
                0,
            )
            .unwrap();
        } else {
            fs::create_dir(&path).unwrap();
            fs::write(path.join("inside"), b"x").unwrap();
        }
        (hash, data)
    };
    // A reader must not hang on the FIFO: run it with a deadline.
    let (fifo_hash, fifo_data) = plant(901, true);
    let s = store.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(s.read_verified(&fifo_hash).map(|b| b.is_some())));
    let found = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("reading a FIFO under a block name hung")
        .unwrap();
    assert!(!found);
    assert_eq!(
        store.insert(&fifo_hash, &fifo_data).unwrap(),
        InsertOutcome::Inserted
    );
    assert_eq!(
        store.read_verified(&fifo_hash).unwrap().as_deref(),
        Some(&fifo_data[..])
    );
    // A directory under a block name: the real block is stored over it.
    let (dir_hash, dir_data) = plant(902, false);
    assert_eq!(
        store.insert(&dir_hash, &dir_data).unwrap(),
        InsertOutcome::Inserted
    );
    assert_eq!(
        store.read_verified(&dir_hash).unwrap().as_deref(),
        Some(&dir_data[..])
    );
    // verify discards and reports both kinds.
    let (h1, _) = plant(903, true);
    let (h2, _) = plant(904, false);
    let report = store.verify_all().unwrap();
    assert_eq!(report.bad_blocks_discarded, 2, "{report:?}");
    let mut bad = report.bad_hashes.clone();
    bad.sort();
    let mut want = vec![h1.to_hex(), h2.to_hex()];
    want.sort();
    assert_eq!(bad, want);
    assert!(!store.block_path(&h1).exists() && !store.block_path(&h2).exists());
}

fn dst_file(dir: &Path, blocks: u64) -> File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("f"))
        .unwrap();
    f.set_len(blocks * BLOCK_SIZE as u64).unwrap();
    f
}

/// A wrong proof reads no block (a corrupt stored copy would be noticed and discarded if it
/// were read), refreshes no last-use time and pins nothing; one announce repeating a stored hash
/// costs one check; the lease stays empty however many hashes are announced.
#[test]
fn failed_proofs_read_nothing_change_nothing_and_cost_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CasStore::open(dir.path(), 1 << 30).unwrap());
    let data = block(77, BLOCK_SIZE);
    let h = BlockHash::of(&data);
    store.insert(&h, &data).unwrap();
    set_last_used(&store, &h, 3600);
    let before = fs::metadata(store.block_path(&h))
        .unwrap()
        .modified()
        .unwrap();
    // Corrupt the stored bytes: reading them would discard the block.
    OpenOptions::new()
        .write(true)
        .open(store.block_path(&h))
        .unwrap()
        .write_all_at(b"X", 0)
        .unwrap();
    set_last_used(&store, &h, 3600);
    let before = before.max(
        fs::metadata(store.block_path(&h))
            .unwrap()
            .modified()
            .unwrap(),
    );

    let receiver = DedupReceiver::new(store.clone(), "probe").unwrap();
    let key = PopKey::derive(&pop::challenge());
    let dst_dir = tempfile::tempdir().unwrap();
    let dst = dst_file(dst_dir.path(), 4096);
    let forged = |hash: BlockHash, index: u64| ferry_mover::cas::dedup::AnnouncedBlock {
        index,
        hash,
        proof: Proof(*hash.as_bytes()),
    };
    // The stored hash 4096 times in one announce.
    let repeated: Vec<_> = (0..4096).map(|i| forged(h, i)).collect();
    let started = std::time::Instant::now();
    let need = receiver
        .materialize_announced(&key, &dst, &repeated)
        .unwrap();
    let took = started.elapsed();
    assert!(need.iter().all(|n| *n));
    assert!(
        took < Duration::from_millis(500),
        "4096 repeats cost {took:?}"
    );
    let c = receiver.counters();
    assert_eq!(c.corrupt_discarded, 0, "a failed proof read the block");
    assert_eq!(c.proofs_rejected, 1, "each distinct hash is checked once");
    assert!(store.block_path(&h).exists());
    let after = fs::metadata(store.block_path(&h))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(after, before, "a failed proof refreshed the last-use time");
    assert!(
        receiver.lease().is_empty(),
        "a failed proof pinned the block"
    );

    // 20 announces of 65 536 random hashes pin nothing.
    for round in 0..20u64 {
        let many: Vec<_> = (0..65536u64)
            .map(|i| forged(BlockHash::of(&(round << 32 | i).to_le_bytes()), i % 4096))
            .collect();
        receiver.materialize_announced(&key, &dst, &many).unwrap();
    }
    assert!(
        receiver.lease().is_empty(),
        "{} bytes of lease",
        receiver.lease().len()
    );

    // Timing of one failed proof, block held against block absent (a figure, not a bound: the
    // shared build machine is too noisy to assert on).
    let absent = BlockHash::of(b"not in the store");
    let time = |hash: BlockHash| {
        let one = [forged(hash, 0)];
        let started = std::time::Instant::now();
        for _ in 0..2000 {
            receiver.materialize_announced(&key, &dst, &one).unwrap();
        }
        started.elapsed().as_secs_f64() * 1e6 / 2000.0
    };
    let (held, missing) = (time(h), time(absent));
    eprintln!("failed proof: {held:.1} us with the block in the store, {missing:.1} us without");
    assert_eq!(receiver.counters().corrupt_discarded, 0);
}

/// A proven block repeated in one announce is read and pinned once.
#[test]
fn a_proven_block_repeated_in_one_announce_is_read_and_pinned_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CasStore::open(dir.path(), 1 << 30).unwrap());
    let data = block(78, BLOCK_SIZE);
    let h = BlockHash::of(&data);
    store.insert(&h, &data).unwrap();
    let receiver = DedupReceiver::new(store.clone(), "honest").unwrap();
    let nonce = pop::challenge();
    let key = PopKey::derive(&nonce);
    let sender = DedupSender::new(&nonce);
    let dst_dir = tempfile::tempdir().unwrap();
    let dst = dst_file(dst_dir.path(), 64);
    let announced: Vec<_> = (0..64).map(|i| sender.announce(i, &data)).collect();
    let need = receiver
        .materialize_announced(&key, &dst, &announced)
        .unwrap();
    assert!(!need[0], "the first is taken from the store");
    assert!(need[1..].iter().all(|n| *n), "repeats come over the wire");
    assert_eq!(receiver.counters().dedup_blocks, 1);
    assert_eq!(receiver.lease().len(), 65, "one pin: one hex line");
    let mut back = vec![0u8; BLOCK_SIZE];
    dst.read_exact_at(&mut back, 0).unwrap();
    assert!(back == data);
}
