//! What a node service's memory costs per client. A fan-out destination keeps Takes open on
//! its peers' services while they still receive; each of those streams, once it sent a block
//! and waits for the next, must not keep a block's worth of buffers, or the service's memory
//! would grow with the number of destinations past its pod's limit. The service is the real
//! `ferry-mover node serve` binary with real TLS; its resident set is read from /proc.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::node::{CLUSTER, ServiceProcess};
use common::*;
use ferry_mover::cas::pop::{Nonce, PopKey};
use ferry_mover::cas::{BLOCK_SIZE, BlockHash};
use ferry_mover::net::{self, Role};
use ferry_mover::node::client::NodeStoreClient;
use ferry_proto::blockstore::v1 as pb;

/// Takes per connection (the service admits 16 at once on one connection).
const PER_CONNECTION: usize = 8;

/// The resident set once it stopped moving: the largest of several samples after the last
/// block went out (the service frees what it will within this time, or never).
async fn settled_rss_kib(pid: u32) -> u64 {
    let mut samples = Vec::new();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        samples.push(proc_status_kib(pid, "VmRSS").unwrap());
    }
    samples.into_iter().max().unwrap()
}

/// The next block of a reply, from its pieces (each at most the service's piece size).
async fn whole_block(s: &mut tonic::Streaming<pb::TakenBlock>) -> Option<(u32, Vec<u8>)> {
    let first = s.message().await.unwrap()?;
    let (position, mut data, mut more) = (first.position, first.data.to_vec(), first.more);
    while more {
        let piece = s.message().await.unwrap().expect("the rest of the block");
        assert_eq!(piece.position, position);
        assert!(piece.data.len() <= ferry_mover::node::service::TAKE_PIECE);
        data.extend_from_slice(&piece.data);
        more = piece.more;
    }
    Some((position, data))
}

/// Opens `n` fan-out Takes for `[held, missing]` and returns them once each delivered `held`:
/// every stream then waits (up to a minute) for `missing`.
async fn waiting_takes(
    clients: &[NodeStoreClient],
    key: &PopKey,
    held: &[u8],
    missing: &[u8],
    n: usize,
) -> Vec<tonic::Streaming<pb::TakenBlock>> {
    let block = |data: &[u8]| pb::AnnouncedBlock {
        hash: BlockHash::of(data).as_bytes().to_vec(),
        proof: key.prove(data).0.to_vec(),
    };
    let request = pb::TakeRequest {
        pop_key: key.to_bytes().to_vec(),
        blocks: vec![block(held), block(missing)],
        wait_ms: 60_000,
        pieces: true,
    };
    let opened = (0..n).map(|i| {
        let mut c = clients[i / PER_CONNECTION].grpc();
        let request = request.clone();
        async move {
            let mut s = c.take(request).await.unwrap().into_inner();
            let (position, data) = whole_block(&mut s).await.expect("the held block");
            assert_eq!(position, 0);
            assert!(data == held);
            s
        }
    });
    futures::future::join_all(opened).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_takes_waiting_for_blocks_do_not_each_keep_a_block_in_memory() {
    const STREAMS: usize = 64;
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let svc = ServiceProcess::start(&ca);
    let pid = svc.child.id();
    // One connection per fan-out destination, each its own Transfer's receiver (the service
    // bounds what one client may hold, waiting Takes included), as a service's fellow
    // destinations connect to it.
    let mut clients = Vec::new();
    let mut pkis = Vec::new();
    for i in 0..1 + STREAMS.div_ceil(PER_CONNECTION) {
        let pki = Pki::scoped(&ca, CLUSTER, &format!("dest-{i}"), 1);
        clients.push(
            NodeStoreClient::connect(&svc.addr.to_string(), &pki.files(Role::Receiver))
                .await
                .unwrap(),
        );
        pkis.push(pki);
    }
    let held = random_bytes(BLOCK_SIZE, 1);
    let missing = random_bytes(BLOCK_SIZE, 2);
    let mut c = clients[0].grpc();
    c.put(pb::PutRequest {
        hash: BlockHash::of(&held).as_bytes().to_vec(),
        data: held.clone().into(),
    })
    .await
    .unwrap();
    let key = PopKey::derive(&Nonce([7; 32]));

    // Warm up (threads, TLS, the allocator's arenas) with one connection's worth of Takes.
    let warm = waiting_takes(&clients[..1], &key, &held, &missing, PER_CONNECTION).await;
    let before = settled_rss_kib(pid).await;
    let started = Instant::now();
    let rest = waiting_takes(&clients[1..], &key, &held, &missing, STREAMS).await;
    let after = settled_rss_kib(pid).await;
    let per_stream = after.saturating_sub(before) / STREAMS as u64;
    eprintln!(
        "{STREAMS} waiting Takes: {before} KiB -> {after} KiB ({per_stream} KiB each), opened in \
         {:?}",
        started.elapsed()
    );
    // A block is 4096 KiB (what each kept before pieces); a waiting stream may keep a piece's
    // buffers and its bookkeeping (about 400 KiB measured), not a block.
    assert!(
        per_stream < 1024,
        "each waiting Take keeps {per_stream} KiB ({before} KiB -> {after} KiB for {STREAMS})"
    );

    // Still served: the missing block, once put, reaches every waiting stream.
    c.put(pb::PutRequest {
        hash: BlockHash::of(&missing).as_bytes().to_vec(),
        data: missing.clone().into(),
    })
    .await
    .unwrap();
    // Read at once, as destinations do: a stream nobody reads holds its block's place in the
    // service's bounded outgoing queue once HTTP/2's windows are full.
    let read = warm.into_iter().chain(rest).map(|mut s| {
        let missing = &missing;
        async move {
            let (position, data) = whole_block(&mut s)
                .await
                .expect("the missing block, once put");
            assert_eq!(position, 1);
            assert!(data == *missing);
            assert!(s.message().await.unwrap().is_none());
        }
    });
    tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(read))
        .await
        .expect("every waiting Take gets the block within a minute of its put");
}
