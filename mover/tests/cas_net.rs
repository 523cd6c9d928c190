//! Dedup over the network: real TLS on 127.0.0.1, a receiver with a block store, real files.
//! Each test sends something, then sends content the store already holds under other names and
//! checks what crossed the wire, what came from the store, and that the destination is exact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferry_mover::cas::pop::{Nonce, PopKey};
use ferry_mover::cas::{BLOCK_SIZE, BlockHash, CasStore};
use ferry_mover::progress::Progress;
use ferry_mover::session::{
    self, Compress, FrameReader, FrameWriter, ReceiverConfig, SessionSummary, accept_stream,
    receive_session,
};
use ferry_mover::wire::{self, Message, caps};
use ferry_proto::wire::v1 as pb;

const MIB: u64 = 1 << 20;

async fn round_trip_cas(
    pki: &Pki,
    src: &Path,
    dst: &Path,
    store: &Arc<CasStore>,
    streams: u32,
) -> (SessionSummary, SessionSummary) {
    let (addr, recv) = start_receiver_with_store(pki, dst, Some(store.clone())).await;
    let o = SendOpts {
        streams,
        compress: Compress::None,
        ..Default::default()
    };
    let sent = send(pki, src, addr, &o).await.expect("send");
    let received = recv.await.unwrap().expect("receive");
    (sent, received)
}

/// `n` distinct 4 MiB blocks, cheap to make: one random block with the block number stamped in.
fn blocks(n: usize, seed: u64) -> Vec<Vec<u8>> {
    let base = random_bytes(BLOCK_SIZE, seed);
    (0..n)
        .map(|i| {
            let mut b = base.clone();
            b[..8].copy_from_slice(&(i as u64).to_le_bytes());
            b[8..16].copy_from_slice(&seed.to_le_bytes());
            b
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_send_of_a_1_gib_file_puts_at_most_1_percent_on_the_wire() {
    let pki = pki("cas-1g");
    let work = tempfile::tempdir().unwrap();
    let store = Arc::new(CasStore::open(&work.path().join("store"), 4 << 30).unwrap());
    let src = work.path().join("src");
    let content = blocks(256, 1).concat();
    write(&src.join("model.bin"), &content);
    drop(content);

    let dst1 = work.path().join("dst1");
    let (first, r1) = round_trip_cas(&pki, &src, &dst1, &store, 2).await;
    assert_same_tree(&src, &dst1);
    assert_eq!(r1.dedup_blocks, 0, "fresh store: nothing to dedup");
    assert!(first.wire_bytes >= 1 << 30, "first send: {first:?}");
    assert_eq!(store.stats().unwrap().blocks, 256, "every block was stored");

    let dst2 = work.path().join("dst2");
    let (second, r2) = round_trip_cas(&pki, &src, &dst2, &store, 2).await;
    assert_same_tree(&src, &dst2);
    assert_eq!(r2.dedup_blocks, 256);
    assert_eq!(r2.dedup_bytes, 1 << 30);
    assert_eq!(second.dedup_blocks, 256, "the sender reports it too");
    assert!(
        second.wire_bytes * 100 <= first.wire_bytes,
        "second wire_bytes {} > 1 % of first {}",
        second.wire_bytes,
        first.wire_bytes
    );
    eprintln!(
        "1 GiB: first wire {} B, second wire {} B ({:.3} %)",
        first.wire_bytes,
        second.wire_bytes,
        second.wire_bytes as f64 * 100.0 / first.wire_bytes as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_and_moved_files_hit_the_store() {
    let pki = pki("cas-rename");
    let work = tempfile::tempdir().unwrap();
    let store = Arc::new(CasStore::open(&work.path().join("store"), 1 << 30).unwrap());
    // 10 full blocks and a 1000-byte tail (the tail always travels).
    let mut content = blocks(10, 2).concat();
    content.extend_from_slice(&random_bytes(1000, 3));

    let a = work.path().join("a");
    write(&a.join("data/train.bin"), &content);
    let (_, r) = round_trip_cas(&pki, &a, &work.path().join("d1"), &store, 2).await;
    assert_eq!(r.dedup_blocks, 0);

    // Renamed, same directory.
    let b = work.path().join("b");
    write(&b.join("data/train-v2.bin"), &content);
    let d2 = work.path().join("d2");
    let (sent, r) = round_trip_cas(&pki, &b, &d2, &store, 2).await;
    assert_same_tree(&b, &d2);
    assert_eq!(
        (r.dedup_blocks, r.dedup_bytes),
        (10, 10 * BLOCK_SIZE as u64)
    );
    assert!(sent.wire_bytes < MIB, "renamed: wire {}", sent.wire_bytes);

    // Moved to another directory (and renamed), plus a new small file.
    let c = work.path().join("c");
    write(&c.join("archive/2026/old.bin"), &content);
    write(&c.join("README"), b"moved\n");
    let d3 = work.path().join("d3");
    let (sent, r) = round_trip_cas(&pki, &c, &d3, &store, 3).await;
    assert_same_tree(&c, &d3);
    assert_eq!(r.dedup_blocks, 10);
    assert!(sent.wire_bytes < MIB, "moved: wire {}", sent.wire_bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_sharing_90_percent_of_its_blocks_sends_at_most_15_percent() {
    let pki = pki("cas-shared");
    let work = tempfile::tempdir().unwrap();
    let store = Arc::new(CasStore::open(&work.path().join("store"), 1 << 30).unwrap());
    let old = blocks(20, 4);
    let first = work.path().join("first");
    write(&first.join("shard-0"), &old[..10].concat());
    write(&first.join("shard-1"), &old[10..].concat());
    let (_, r) = round_trip_cas(&pki, &first, &work.path().join("d1"), &store, 2).await;
    assert_eq!(r.dedup_blocks, 0);

    // Another dataset: 18 of those blocks in other files and another order, 2 new ones.
    let new = blocks(2, 5);
    let second = work.path().join("second");
    let mut x: Vec<Vec<u8>> = old[..9].iter().rev().cloned().collect();
    x.push(new[0].clone());
    let mut y: Vec<Vec<u8>> = old[11..].to_vec();
    y.push(new[1].clone());
    write(&second.join("ds/x.bin"), &x.concat());
    write(&second.join("ds/y.bin"), &y.concat());
    let size = tree_bytes(&second);
    let d2 = work.path().join("d2");
    let (sent, r) = round_trip_cas(&pki, &second, &d2, &store, 2).await;
    assert_same_tree(&second, &d2);
    assert_eq!(r.dedup_blocks, 18);
    assert!(
        sent.wire_bytes * 100 <= size * 15,
        "wire {} > 15 % of {}",
        sent.wire_bytes,
        size
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_stored_block_is_discarded_and_refetched() {
    let pki = pki("cas-rot");
    let work = tempfile::tempdir().unwrap();
    let store = Arc::new(CasStore::open(&work.path().join("store"), 1 << 30).unwrap());
    let b = blocks(4, 6);
    let src = work.path().join("src");
    write(&src.join("f"), &b.concat());
    round_trip_cas(&pki, &src, &work.path().join("d1"), &store, 1).await;

    // Bit rot in block 2's stored copy.
    let path = store.block_path(&BlockHash::of(&b[2]));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[123_456] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();

    let d2 = work.path().join("d2");
    let (sent, r) = round_trip_cas(&pki, &src, &d2, &store, 1).await;
    assert_same_tree(&src, &d2);
    assert_eq!(r.dedup_blocks, 3, "the bad block came over the wire");
    assert!(sent.wire_bytes >= BLOCK_SIZE as u64);
    assert!(store.corrupt_discarded() >= 1);
    // And it was stored again, good this time.
    assert_eq!(
        store.read_verified(&BlockHash::of(&b[2])).unwrap().unwrap(),
        b[2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_under_a_small_cap_spares_the_blocks_a_running_transfer_uses() {
    let pki = pki("cas-evict");
    let work = tempfile::tempdir().unwrap();
    let store_dir = work.path().join("store");
    // Cap of two blocks; the store starts with the 5 blocks of x.bin and 3 unrelated ones.
    let cap = 2 * BLOCK_SIZE as u64;
    let store = Arc::new(CasStore::open(&store_dir, 1 << 40).unwrap());
    let x = blocks(5, 7);
    let junk = blocks(3, 8);
    for blk in x.iter().chain(&junk) {
        store.insert(&BlockHash::of(blk), blk).unwrap();
    }
    let store = Arc::new(CasStore::open(&store_dir, cap).unwrap());
    // One stream, so x.bin's announce (which pins its blocks) precedes y.bin's blocks, whose
    // insertion pushes the store over its cap and triggers eviction mid-transfer.
    let src = work.path().join("src");
    write(&src.join("a/x.bin"), &x.concat());
    write(&src.join("b/y.bin"), &blocks(6, 9).concat());
    let dst = work.path().join("dst");
    let (_, r) = round_trip_cas(&pki, &src, &dst, &store, 1).await;
    assert_same_tree(&src, &dst);
    assert_eq!(r.dedup_blocks, 5, "x.bin came from the store");
    for blk in &x {
        assert!(
            store.lookup(&BlockHash::of(blk)).unwrap().is_some(),
            "a pinned block was evicted"
        );
    }
    for blk in &junk {
        assert!(
            store.lookup(&BlockHash::of(blk)).unwrap().is_none(),
            "unpinned least recently used blocks go first"
        );
    }
    let s = store.stats().unwrap();
    assert_eq!(s.live_leases, 0, "the transfer's lease is gone");
    // Pinned blocks kept the store above its cap during the transfer; with the lease gone a gc
    // brings it down.
    let g = store.gc(None).unwrap();
    assert!(g.reached_target && g.bytes_after <= cap, "{g:?}");
}

/// A sender that knows a block's hash but not its bytes announces it with a forged proof. The
/// receiver must not take the block from its store: it asks for the bytes instead, which the
/// attacker cannot supply, so the file never appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_announced_without_possession_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let store = Arc::new(CasStore::open(&work.path().join("store"), 1 << 30).unwrap());
    let secret = random_bytes(BLOCK_SIZE, 42); // another tenant's block
    let h = BlockHash::of(&secret);
    store.insert(&h, &secret).unwrap();

    let (client, server) = tokio::io::duplex(8 << 20);
    let cfg = ReceiverConfig {
        root: root.clone(),
        transfer_id: "evil".into(),
        timeouts: fast_timeouts(),
        sync: false,
        cas: Some(store.clone()),
        block_service: None,
        swarm: None,
        identity: None,
        keep: Default::default(),
        shutdown: ferry_mover::session::Shutdown::never(),
    };
    let recv = tokio::spawn(async move {
        let progress = Arc::new(Progress::new("evil", "receiver"));
        let acc = accept_stream(server, &cfg, progress.wire_bytes.clone(), 0)
            .await
            .map_err(|e| session::error_chain(&e))?;
        receive_session(&cfg, vec![acc], progress)
            .await
            .map_err(|e| session::error_chain(&e))
    });
    let (r, w) = tokio::io::split(client);
    let mut reader = FrameReader::new(r, 0, Duration::from_secs(5), Default::default());
    let mut writer = FrameWriter::new(w, 0, Duration::from_secs(5), Default::default());
    writer
        .send(&Message::Hello(pb::Hello {
            version: wire::PROTOCOL_VERSION,
            capabilities: caps::SUPPORTED | caps::DEDUP,
            transfer_id: "evil".into(),
            session_id: vec![7; 16],
            stream_index: 0,
            stream_count: 1,
            block_size: BLOCK_SIZE as u32,
            filter_rules: Vec::new(),
        }))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    let nonce = match reader.expect().await.unwrap() {
        Message::Welcome(w) => {
            assert_ne!(
                w.capabilities & caps::DEDUP,
                0,
                "a receiver with a store offers dedup"
            );
            <[u8; 32]>::try_from(w.dedup_nonce.as_slice()).expect("32-byte nonce")
        }
        other => panic!("expected Welcome, got {other:?}"),
    };
    let entries = (0..3)
        .map(|i| pb::Entry {
            path: format!("stolen-{i}.bin").into(),
            kind: pb::EntryKind::File as i32,
            mode: 0o644,
            size: BLOCK_SIZE as u64,
            ..Default::default()
        })
        .collect();
    writer
        .send(&Message::Offer(pb::Offer {
            offer_id: 1,
            entries,
        }))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    let file_ids: Vec<u64> = match reader.expect().await.unwrap() {
        Message::Want(w) => w.entries.iter().map(|e| e.file_id).collect(),
        other => panic!("expected Want, got {other:?}"),
    };
    // Forgeries: the hash itself, a keyed hash over the hash under the real nonce, and a real
    // proof over the real bytes under another nonce (a replay from some other session).
    let forged = [
        *h.as_bytes(),
        PopKey::derive(&Nonce(nonce)).prove(h.as_bytes()).0,
        PopKey::derive(&Nonce([0; 32])).prove(&secret).0,
    ];
    for (file_id, proof) in file_ids.iter().zip(forged) {
        writer
            .send(&Message::BlockAnnounce(pb::BlockAnnounce {
                file_id: *file_id,
                hashes: vec![h.as_bytes().to_vec()],
                indexes: vec![0],
                proofs: vec![proof.to_vec()],
            }))
            .await
            .unwrap();
        writer.flush().await.unwrap();
        match reader.expect().await.unwrap() {
            Message::NeedBlocks(n) => {
                assert_eq!(n.file_id, *file_id);
                assert_eq!(n.need_blocks, vec![1], "a forged block must be asked for");
            }
            other => panic!("expected NeedBlocks, got {other:?}"),
        }
    }
    writer.shutdown().await;
    let out = recv.await.unwrap();
    assert!(
        out.is_err(),
        "the session cannot complete without the bytes"
    );
    assert!(
        !root.join("stolen.bin").exists(),
        "the secret was materialised"
    );
    // No staging file holds the secret either.
    fn holds_secret(dir: &Path, secret: &[u8]) -> bool {
        std::fs::read_dir(dir).into_iter().flatten().any(|e| {
            let p = e.unwrap().path();
            if p.is_dir() {
                holds_secret(&p, secret)
            } else {
                std::fs::read(&p).is_ok_and(|b| b.windows(64).any(|w| w == &secret[..64]))
            }
        })
    }
    assert!(!holds_secret(&root, &secret));
    assert!(
        store.lookup(&h).unwrap().is_some(),
        "the victim's block is still stored"
    );
}

/// Two receivers (separate store handles, as two processes would have) fill and use one store at
/// the same time; the store ends consistent and serves a third transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_receivers_share_one_store_at_the_same_time() {
    let work = tempfile::tempdir().unwrap();
    let store_dir = work.path().join("store");
    let s1 = Arc::new(CasStore::open(&store_dir, 1 << 30).unwrap());
    let s2 = Arc::new(CasStore::open_existing(&store_dir).unwrap());
    let shared = blocks(8, 10);
    let src1 = work.path().join("src1");
    let src2 = work.path().join("src2");
    write(&src1.join("one.bin"), &shared.concat());
    write(&src2.join("elsewhere/two.bin"), &shared.concat());
    let (p1, p2) = (pki("cas-share-1"), pki("cas-share-2"));
    let (d1, d2) = (work.path().join("d1"), work.path().join("d2"));
    let (a, b) = tokio::join!(
        round_trip_cas(&p1, &src1, &d1, &s1, 2),
        round_trip_cas(&p2, &src2, &d2, &s2, 2)
    );
    assert_same_tree(&src1, &d1);
    assert_same_tree(&src2, &d2);
    // Whatever the interleaving, every block reached each destination exactly once.
    assert!(a.1.dedup_blocks + b.1.dedup_blocks <= 8);
    let stats = s1.stats().unwrap();
    assert_eq!(stats.blocks, 8);
    assert_eq!(stats.live_leases, 0);
    assert_eq!(s1.verify_all().unwrap().bad_blocks_discarded, 0);
    assert!(
        std::fs::read_dir(store_dir.join("tmp"))
            .unwrap()
            .next()
            .is_none(),
        "no temp left behind"
    );
    let d3 = work.path().join("d3");
    let (_, r) = round_trip_cas(&p1, &src1, &d3, &s2, 2).await;
    assert_eq!(r.dedup_blocks, 8);
    assert_same_tree(&src1, &d3);
}

#[test]
fn a_block_store_that_cannot_be_opened_is_a_store_fault_a_retry_may_pass() {
    let pki = pki("cas-broken");
    let tmp = tempfile::tempdir().unwrap();
    let not_a_dir = tmp.path().join("cas");
    std::fs::write(&not_a_dir, b"a file where the store should be").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["receive", "--listen", "127.0.0.1:0", "--once", "--cas"])
        .arg(&not_a_dir)
        .arg("--root")
        .arg(tmp.path().join("dst"))
        .args(pki.args("receiver"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Exit 16: kind store, retryable (the operator goes on without the store).
    assert_eq!(out.status.code(), Some(16), "{stderr}");
    assert!(
        stderr.contains("error (store)") && stderr.contains("block store"),
        "{stderr}"
    );
}
