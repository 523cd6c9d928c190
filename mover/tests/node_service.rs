//! The node service (`ferry-mover node serve`) on 127.0.0.1 with real TLS, a real store and
//! real files: receivers of different transfers share it, it hands out only proven blocks,
//! keeps only blocks whose content matches their name, stays under its cap, and admits only this
//! cluster's receivers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::node::*;
use common::*;
use ferry_mover::cas::pop::{Nonce, PopKey};
use ferry_mover::cas::{BLOCK_SIZE, BlockHash};
use ferry_mover::net::{self, Role};
use ferry_mover::node::client::NodeStoreClient;
use ferry_mover::node::{self, NodeServiceConfig};
use ferry_mover::session::sender::shared::SharedReads;
use ferry_mover::session::{Compress, Shutdown};
use ferry_proto::blockstore::v1 as pb;
use ferry_proto::blockstore::v1::block_store_client::BlockStoreClient;

fn dataset(root: &Path, seed: u64) {
    // Two files of two full blocks and a tail each, and one small file.
    for (i, name) in ["a.bin", "d/b.bin"].iter().enumerate() {
        write(
            &root.join(name),
            &random_bytes(2 * BLOCK_SIZE + 1000, seed + i as u64),
        );
    }
    write(&root.join("small.txt"), b"small");
}

async fn send_via_service(
    pki: &Pki,
    svc: &NodeService,
    src: &Path,
    dst: &Path,
) -> (
    ferry_mover::session::SessionSummary,
    ferry_mover::session::SessionSummary,
) {
    let (addr, recv) = start_receiver_with_service(pki, dst, client_for(pki, svc).await).await;
    let o = SendOpts {
        compress: Compress::None,
        ..Default::default()
    };
    let sent = send(pki, src, addr, &o).await.expect("send");
    (sent, recv.await.unwrap().expect("receive"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receivers_of_two_transfers_share_the_node_store_through_the_service() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let svc = start_node_service(&ca, 1 << 30).await;
    let src = tempfile::tempdir().unwrap();
    dataset(src.path(), 7);

    let first_pki = Pki::scoped(&ca, CLUSTER, "first-1", 1);
    let dst1 = tempfile::tempdir().unwrap();
    let (_, r1) = send_via_service(&first_pki, &svc, src.path(), dst1.path()).await;
    assert_same_tree(src.path(), dst1.path());
    assert_eq!(r1.dedup_blocks, 0, "{r1:?}");

    let stats = operator_stats(&first_pki, &svc).await;
    assert_eq!((stats.blocks, stats.inserted), (4, 4), "{stats:?}");

    // Another Transfer, another attempt: the four full blocks come from the node's store.
    let second_pki = Pki::scoped(&ca, CLUSTER, "second-1", 3);
    let dst2 = tempfile::tempdir().unwrap();
    let (sent, r2) = send_via_service(&second_pki, &svc, src.path(), dst2.path()).await;
    assert_same_tree(src.path(), dst2.path());
    assert_eq!(r2.dedup_blocks, 4, "{r2:?}");
    assert_eq!(r2.dedup_bytes, 4 * BLOCK_SIZE as u64);
    assert!(
        sent.wire_bytes < 64 * 1024,
        "only tails and metadata crossed the wire: {sent:?}"
    );
    let stats = operator_stats(&second_pki, &svc).await;
    assert_eq!(stats.hits, 4, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_keeps_full_blocks_and_tails_of_at_least_1_mib_only() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let svc = start_node_service(&ca, 1 << 30).await;
    let pki = Pki::scoped(&ca, CLUSTER, "tails-1", 1);
    let mut c = raw_client(&pki, Role::Receiver, &svc).await.unwrap();
    let put = |data: Vec<u8>| pb::PutRequest {
        hash: BlockHash::of(&data).as_bytes().to_vec(),
        data: data.into(),
    };
    for (len, seed) in [(1 << 20, 50), (3 << 20, 51)] {
        let kept = c.put(put(random_bytes(len, seed))).await.unwrap();
        assert!(kept.get_ref().inserted, "a {len}-byte block");
    }
    for (len, seed) in [((1 << 20) - 1, 52), (BLOCK_SIZE + 1, 53), (0, 54)] {
        let refused = c.put(put(random_bytes(len, seed))).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::InvalidArgument,
            "{len}: {refused:?}"
        );
    }
    // A tail goes out whole against its proof, as a full block does.
    let tail = random_bytes(3 << 20, 51);
    let key = PopKey::derive(&Nonce([7; 32]));
    let req = pb::TakeRequest {
        pop_key: key.to_bytes().to_vec(),
        blocks: vec![pb::AnnouncedBlock {
            hash: BlockHash::of(&tail).as_bytes().to_vec(),
            proof: key.prove(&tail).0.to_vec(),
        }],
        wait_ms: 0,
        pieces: false,
    };
    let mut taken = c.take(req).await.unwrap().into_inner();
    let b = taken.message().await.unwrap().expect("the tail");
    assert!(b.data == tail, "the tail as stored");
    let stats = operator_stats(&pki, &svc).await;
    assert_eq!(stats.blocks, 2, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_go_out_only_against_a_proof_and_in_only_when_they_match_their_name() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let svc = start_node_service(&ca, 1 << 30).await;
    let pki = Pki::scoped(&ca, CLUSTER, "probe-1", 1);
    let mut c = raw_client(&pki, Role::Receiver, &svc).await.unwrap();

    let block = random_bytes(BLOCK_SIZE, 42);
    let hash = BlockHash::of(&block);
    // A block whose content does not match the hash it is put under is refused and not kept.
    let wrong = c
        .put(pb::PutRequest {
            hash: BlockHash::of(b"other").as_bytes().to_vec(),
            data: block.clone().into(),
        })
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::InvalidArgument, "{wrong:?}");
    let put = c
        .put(pb::PutRequest {
            hash: hash.as_bytes().to_vec(),
            data: block.clone().into(),
        })
        .await
        .unwrap();
    assert!(put.get_ref().inserted);

    let key = PopKey::derive(&Nonce([9; 32]));
    let take = |proof: [u8; 32], hash: BlockHash| pb::TakeRequest {
        pop_key: key.to_bytes().to_vec(),
        blocks: vec![pb::AnnouncedBlock {
            hash: hash.as_bytes().to_vec(),
            proof: proof.to_vec(),
        }],
        wait_ms: 0,
        pieces: false,
    };
    let collect = |mut c: BlockStoreClient<_>, req| async move {
        let mut s = c.take(req).await.unwrap().into_inner();
        let mut out = Vec::new();
        while let Some(b) = s.message().await.unwrap() {
            out.push(b);
        }
        out
    };
    // Knowing the hash is not enough: a wrong proof gets the same nothing as an absent block.
    let guessed = collect(c.clone(), take([0; 32], hash)).await;
    assert!(guessed.is_empty());
    let absent = collect(c.clone(), take([0; 32], BlockHash::of(b"absent"))).await;
    assert!(absent.is_empty());
    // Holding the content is.
    let proven = collect(c.clone(), take(key.prove(&block).0, hash)).await;
    assert_eq!(proven.len(), 1);
    assert_eq!(proven[0].position, 0);
    assert!(proven[0].data == block, "the block as stored");

    // Misses count the wrong proof and the absent block alike.
    let stats = operator_stats(&pki, &svc).await;
    assert_eq!(
        (stats.hits, stats.proofs_rejected, stats.blocks),
        (1, 2, 1),
        "{stats:?}"
    );

    // Oversized requests are refused whole.
    let many = pb::TakeRequest {
        pop_key: key.to_bytes().to_vec(),
        blocks: vec![
            pb::AnnouncedBlock {
                hash: hash.as_bytes().to_vec(),
                proof: vec![0; 32],
            };
            node::MAX_TAKE + 1
        ],
        wait_ms: 0,
        pieces: false,
    };
    assert_eq!(
        c.take(many).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );

    // A fan-out Take waits for a block still on its way and gets it once it is put...
    let later = random_bytes(BLOCK_SIZE, 43);
    let later_hash = BlockHash::of(&later);
    let waiting = |proof: [u8; 32], hash: BlockHash, wait_ms| pb::TakeRequest {
        wait_ms,
        ..take(proof, hash)
    };
    let started = std::time::Instant::now();
    let pending = tokio::spawn(collect(
        c.clone(),
        waiting(key.prove(&later).0, later_hash, 30_000),
    ));
    // ...whenever it comes: the put may land before the Take is read or after.
    c.put(pb::PutRequest {
        hash: later_hash.as_bytes().to_vec(),
        data: later.clone().into(),
    })
    .await
    .unwrap();
    let got = pending.await.unwrap();
    assert_eq!(got.len(), 1);
    assert!(got[0].data == later);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // A wrong proof waits its whole time and gets the same nothing as an absent block.
    let started = std::time::Instant::now();
    assert!(
        collect(c.clone(), waiting([1; 32], later_hash, 300))
            .await
            .is_empty()
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    // A wait past the bound is refused.
    assert_eq!(
        c.take(waiting([1; 32], later_hash, 120_001))
            .await
            .unwrap_err()
            .code(),
        tonic::Code::InvalidArgument
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_stays_under_its_cap() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let cap = 3 * BLOCK_SIZE as u64;
    let svc = start_node_service(&ca, cap).await;
    let pki = Pki::scoped(&ca, CLUSTER, "fill-1", 1);
    let mut c = raw_client(&pki, Role::Receiver, &svc).await.unwrap();
    for seed in 0..8 {
        let block = random_bytes(BLOCK_SIZE, 100 + seed);
        c.put(pb::PutRequest {
            hash: BlockHash::of(&block).as_bytes().to_vec(),
            data: block.into(),
        })
        .await
        .unwrap();
    }
    let stats = operator_stats(&pki, &svc).await;
    assert_eq!(stats.inserted, 8);
    assert!(stats.bytes <= cap, "{stats:?}");
    assert_eq!(stats.cap_bytes, cap);
    let on_disk: u64 = walk_files(&svc.store.join("blocks"))
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(
        on_disk <= cap,
        "{on_disk} bytes of blocks on disk, cap {cap}"
    );
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_this_clusters_receivers_get_in() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let svc = start_node_service(&ca, 1 << 30).await;
    let pki = Pki::scoped(&ca, CLUSTER, "who-1", 1);
    let stats =
        |mut c: BlockStoreClient<tonic::transport::Channel>| async move { served(&mut c).await };
    // A sender of this cluster: refused in the handshake.
    let sender = raw_client(&pki, Role::Sender, &svc).await;
    let refused = match sender {
        Err(e) => e,
        Ok(c) => format!("{:?}", stats(c).await.unwrap_err()),
    };
    assert!(!refused.is_empty());
    // A receiver whose certificate another cluster's CA issued.
    let other_ca = net::Ca::new("other", 1).unwrap();
    let other = Pki::scoped(&other_ca, CLUSTER, "who-1", 1);
    match NodeStoreClient::connect(&svc.addr.to_string(), &other.files(Role::Receiver)).await {
        Err(_) => {}
        Ok(c) => assert!(
            served(&mut c.grpc()).await.is_err(),
            "a foreign CA's receiver was served"
        ),
    }
    // A receiver of this cluster is served, but not the store's figures: those are the
    // operator's.
    let mut receiver = raw_client(&pki, Role::Receiver, &svc).await.unwrap();
    assert!(stats(receiver.clone()).await.is_ok());
    assert_eq!(
        receiver
            .stats(pb::StatsRequest {})
            .await
            .unwrap_err()
            .code(),
        tonic::Code::PermissionDenied
    );
    // The operator reads the figures and neither takes nor puts.
    let mut operator = raw_client(&pki, Role::Operator, &svc).await.unwrap();
    assert!(operator.stats(pb::StatsRequest {}).await.is_ok());
    assert_eq!(
        served(&mut operator).await.unwrap_err().code(),
        tonic::Code::PermissionDenied
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certs_for_a_cluster_run_a_node_service_by_hand() {
    // `ferry-mover certs --cluster` writes what an operator would issue, and a node service's.
    let dir = tempfile::tempdir().unwrap();
    let certs = net::generate_certs_in("by-hand", 1, Some("bench")).unwrap();
    net::write_certs(dir.path(), &certs).unwrap();
    let p = |name: &str| dir.path().join(name);
    let cfg = NodeServiceConfig {
        store: p("cas"),
        cap_bytes: 1 << 30,
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: None,
        ca: p("ca.crt"),
        cert: p("node.crt"),
        key: p("node.key"),
        gc_every: Duration::from_secs(3600),
        node: "node-h".into(),
        fsync: false,
        dedup_domain: node::DedupDomain::Cluster,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (_stop, shutdown) = Shutdown::new();
    tokio::spawn(async move { node::serve(cfg, listener, shutdown).await.unwrap() });
    let load = |role: Role, name: &str| {
        net::load_files(
            &p("ca.crt"),
            &p(&format!("{name}.crt")),
            &p(&format!("{name}.key")),
            "by-hand",
            role,
        )
        .unwrap()
    };
    let client = NodeStoreClient::connect(&addr, &load(Role::Receiver, "receiver"))
        .await
        .unwrap();
    served(&mut client.grpc()).await.unwrap();
    let operator = NodeStoreClient::connect(&addr, &load(Role::Operator, "operator"))
        .await
        .unwrap();
    assert_eq!(operator.stats().await.unwrap().node, "node-h");
    // Its sender certificate is not a receiver's: refused.
    match NodeStoreClient::connect(&addr, &load(Role::Sender, "sender")).await {
        Err(_) => {}
        Ok(c) => assert!(served(&mut c.grpc()).await.is_err(), "a sender was served"),
    }
}

/// The destinations of one fan-out: a node service each, addressed in one agreed order.
struct FanOut {
    services: Vec<NodeService>,
    addrs: Vec<String>,
    /// Destinations that already hold the whole tree (`--swarm-complete`).
    complete: Vec<usize>,
}

async fn fan_out(ca: &net::Ca, n: usize) -> FanOut {
    let mut services = Vec::new();
    for _ in 0..n {
        services.push(start_node_service(ca, 1 << 30).await);
    }
    let addrs = services.iter().map(|s| s.addr.to_string()).collect();
    FanOut {
        services,
        addrs,
        complete: Vec::new(),
    }
}

/// Destination `i` of `f` (its own transfer id and certificate, as each destination's attempt
/// has), receiving into `dst` with the fan-out `wait`.
async fn fan_out_receiver(
    ca: &net::Ca,
    f: &FanOut,
    i: usize,
    dst: &Path,
    wait: Duration,
) -> (
    Pki,
    SocketAddr,
    tokio::task::JoinHandle<Result<ferry_mover::session::SessionSummary, String>>,
) {
    let pki = Pki::scoped(ca, CLUSTER, &format!("fan-d{i}-1"), 1);
    let files = pki.files(Role::Receiver);
    let swarm = node::swarm::SwarmPeers::connect(&f.addrs, i, &f.complete, &files, wait)
        .await
        .unwrap();
    let own = client_for(&pki, &f.services[i]).await;
    let (addr, recv) = start_receiver_in_fan_out(&pki, dst, own, swarm).await;
    (pki, addr, recv)
}

/// Runs a sender and a receiver for each of `dsts` (destinations `0..dsts.len()` of `f`), all at
/// once as a fan-out's pods do, and checks every destination against `src`. Returns the bytes
/// the source sent in all and the blocks the destinations took from stores.
async fn run_fan_out(
    ca: &net::Ca,
    f: &FanOut,
    src: &Path,
    dsts: &[tempfile::TempDir],
    wait: Duration,
) -> (u64, u64) {
    let at: Vec<(usize, &Path)> = dsts.iter().map(|d| d.path()).enumerate().collect();
    run_destinations(ca, f, src, &at, wait).await
}

/// As [`run_fan_out`], for the destinations `at` (each its index in `f` and its directory).
async fn run_destinations(
    ca: &net::Ca,
    f: &FanOut,
    src: &Path,
    at: &[(usize, &Path)],
    wait: Duration,
) -> (u64, u64) {
    let o = SendOpts {
        compress: Compress::None,
        ..Default::default()
    };
    run_destinations_with(ca, f, src, at, wait, &o).await
}

/// As [`run_destinations`], each sender with the options `o`.
async fn run_destinations_with(
    ca: &net::Ca,
    f: &FanOut,
    src: &Path,
    at: &[(usize, &Path)],
    wait: Duration,
    o: &SendOpts,
) -> (u64, u64) {
    let mut runs = Vec::new();
    for &(i, dst) in at {
        let (pki, addr, recv) = fan_out_receiver(ca, f, i, dst, wait).await;
        let (src, o) = (src.to_owned(), o.clone());
        runs.push(tokio::spawn(async move {
            let sent = send(&pki, &src, addr, &o).await.expect("send");
            (sent, recv.await.unwrap().expect("receive"))
        }));
    }
    let (mut wire, mut from_stores) = (0, 0);
    for r in runs {
        let (sent, received) = r.await.unwrap();
        wire += sent.wire_bytes;
        from_stores += received.dedup_blocks;
    }
    for (_, dst) in at {
        assert_same_tree(src, dst);
    }
    (wire, from_stores)
}

fn fan_out_dataset(root: &Path) -> u64 {
    // 18 full blocks over three files (each with a tail), and a small file.
    for (i, name) in ["a.bin", "d/b.bin", "d/e/c.bin"].iter().enumerate() {
        write(
            &root.join(name),
            &random_bytes(6 * BLOCK_SIZE + 777, 100 + i as u64),
        );
    }
    write(&root.join("small.txt"), b"small");
    18
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_to_four_destinations_sends_each_block_from_the_source_once() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let f = fan_out(&ca, 4).await;
    let src = tempfile::tempdir().unwrap();
    let blocks = fan_out_dataset(src.path());
    let dsts: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let (wire, from_stores) =
        run_fan_out(&ca, &f, src.path(), &dsts, Duration::from_secs(60)).await;
    // Each full block crossed from the source once, to its owner; the three other destinations
    // took it from the owner's store.
    assert_eq!(
        from_stores,
        3 * blocks,
        "blocks taken from a fellow destination"
    );
    let full = blocks * BLOCK_SIZE as u64;
    let per_copy_extra = 3 * 777 + 5 + 256 * 1024;
    assert!(
        wire >= full && wire < full + 4 * per_copy_extra,
        "the source sent {wire} bytes for {full} bytes of full blocks to 4 destinations"
    );
}

/// The sessions of one sender (one source, three destinations) share their reads: each full
/// block is read and hashed once, where three senders read it three times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sender_to_three_destinations_reads_each_block_of_the_source_once() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let f = fan_out(&ca, 3).await;
    let src = tempfile::tempdir().unwrap();
    let blocks = fan_out_dataset(src.path());
    let dsts: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let shared = Arc::new(SharedReads::new(dsts.len()));
    let o = SendOpts {
        compress: Compress::None,
        shared: Some(shared.clone()),
        ..Default::default()
    };
    let at: Vec<(usize, &Path)> = dsts.iter().map(|d| d.path()).enumerate().collect();
    let (wire, from_stores) =
        run_destinations_with(&ca, &f, src.path(), &at, Duration::from_secs(60), &o).await;
    assert_eq!(
        from_stores,
        2 * blocks,
        "blocks taken from a fellow destination"
    );
    let full = blocks * BLOCK_SIZE as u64;
    assert!(
        wire >= full && wire < full + 3 * (3 * 777 + 5 + 256 * 1024),
        "the source sent {wire} bytes for {full} bytes of full blocks"
    );
    let counts = shared.counts();
    assert_eq!(
        (counts.reads, counts.shared),
        (blocks, 2 * blocks),
        "blocks read from the source, and taken from another session's read"
    );
    assert_eq!(
        shared.remembered(),
        0,
        "nothing is kept once every session ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_fan_out_a_tail_of_at_least_1_mib_leaves_the_source_once_too() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let f = fan_out(&ca, 3).await;
    let src = tempfile::tempdir().unwrap();
    let mib = 1 << 20;
    // Blocks a store keeps: a.bin's two full blocks and 2 MiB tail, b.bin's one 3 MiB block,
    // c.bin's full block; c.bin's 512 KiB tail and the small file travel to each destination.
    let files = [
        ("a.bin", 2 * BLOCK_SIZE + 2 * mib),
        ("d/b.bin", 3 * mib),
        ("d/c.bin", BLOCK_SIZE + mib / 2),
    ];
    for (i, (name, size)) in files.iter().enumerate() {
        write(&src.path().join(name), &random_bytes(*size, 300 + i as u64));
    }
    write(&src.path().join("small.txt"), b"small");
    let (kept_blocks, kept_bytes) = (5, 2 * BLOCK_SIZE + 2 * mib + 3 * mib + BLOCK_SIZE);
    let travels = mib / 2 + 5;
    let dsts: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (wire, from_stores) =
        run_fan_out(&ca, &f, src.path(), &dsts, Duration::from_secs(60)).await;
    assert_eq!(
        from_stores,
        2 * kept_blocks,
        "blocks (tails included) taken from a fellow destination"
    );
    let once = (kept_bytes + 3 * travels) as u64;
    assert!(
        wire >= once && wire < once + 3 * 256 * 1024,
        "the source sent {wire} bytes; one copy of the kept blocks and three of the rest is {once}"
    );
}

/// Two of three destinations of [`fan_out_dataset`] (`blocks` full blocks) received: each took
/// the other's share from its store, and the third one's share (about a third) came from the
/// source to both, with the small file and the short tails.
fn assert_third_came_from_the_source(blocks: u64, wire: u64, from_stores: u64) {
    assert!(
        from_stores > 0 && from_stores <= 2 * blocks / 3,
        "{from_stores} blocks taken from the live fellow"
    );
    let from_source = (2 * blocks - from_stores) * BLOCK_SIZE as u64;
    let extra = 2 * (3 * 777 + 5 + 256 * 1024);
    assert!(
        wire >= from_source && wire < from_source + extra,
        "the source sent {wire} bytes; {from_source} bytes of full blocks were not in a store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_never_receives_costs_the_others_no_retry() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    // Destination 2's node service runs, but its receiver never does: the blocks it owns never
    // reach its store. Destinations 0 and 1 run.
    let f = fan_out(&ca, 3).await;
    let src = tempfile::tempdir().unwrap();
    let blocks = fan_out_dataset(src.path());
    let dsts: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let started = std::time::Instant::now();
    // One session each (`run_fan_out` fails otherwise): the blocks left to destination 2 come
    // from the sender at the end (Refetch), so no retry is needed.
    let (wire, from_stores) =
        run_fan_out(&ca, &f, src.path(), &dsts, Duration::from_secs(10)).await;
    let took = started.elapsed();
    eprintln!("{from_stores} blocks from the fellow, {wire} bytes from the source, {took:?}");
    assert_third_came_from_the_source(blocks, wire, from_stores);
    // The silent peer costs its --swarm-wait (10 s) once, not once per block.
    assert!(took < Duration::from_secs(60), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_listed_empty_owns_nothing_and_is_not_waited_for() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    // Three destinations; the third is listed empty (the operator's word for a sibling that
    // waits in its queue): the two that run ask the source for its share from the start.
    let mut f = fan_out(&ca, 2).await;
    f.addrs.push(String::new());
    let src = tempfile::tempdir().unwrap();
    let blocks = fan_out_dataset(src.path());
    let dsts: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let wait = Duration::from_secs(90);
    let started = std::time::Instant::now();
    let (wire, from_stores) = run_fan_out(&ca, &f, src.path(), &dsts, wait).await;
    let took = started.elapsed();
    eprintln!("{from_stores} blocks from the fellow, {wire} bytes from the source, {took:?}");
    // Its share was never waited for: a wait would take --swarm-wait (90 s) before the blocks
    // came from the source at the end.
    assert!(took < wait / 3, "{took:?}");
    assert_third_came_from_the_source(blocks, wire, from_stores);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_that_start_after_one_finished_take_every_block_from_it() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    // A fan-out to three run one node at a time, as under a per-node limit: destination 0
    // first, the others listed empty; then 1 and 2 together, 0 listed as holding the tree.
    let mut f = fan_out(&ca, 3).await;
    let src = tempfile::tempdir().unwrap();
    let blocks = fan_out_dataset(src.path());
    let dsts: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let addrs = f.addrs.clone();
    f.addrs = vec![addrs[0].clone(), String::new(), String::new()];
    let wait = Duration::from_secs(60);
    let (first, taken) = run_destinations(&ca, &f, src.path(), &[(0, dsts[0].path())], wait).await;
    assert_eq!(taken, 0);
    assert!(first >= blocks * BLOCK_SIZE as u64, "{first}");

    f.addrs = addrs;
    f.complete = vec![0];
    let later = [(1, dsts[1].path()), (2, dsts[2].path())];
    let (wire, from_stores) = run_destinations(&ca, &f, src.path(), &later, wait).await;
    eprintln!(
        "first {first} bytes; then {wire} bytes from the source, {from_stores} blocks from stores"
    );
    // Every full block came from a store (the finished destination's, or, for a block the
    // other one owns, possibly that one's); the source sent only what no store keeps (the
    // small file and the 777-byte tails) and the sessions' own frames.
    assert_eq!(from_stores, 2 * blocks, "blocks taken from stores");
    assert!(
        wire < 2 * (3 * 777 + 5 + 256 * 1024),
        "the source sent {wire} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tails_left_to_a_destination_that_never_receives_come_from_the_source() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    // As above, destination 2's receiver never runs; every file is one 2 MiB block (a tail the
    // store keeps), so about a third of them are left to it and must be sent again.
    let f = fan_out(&ca, 3).await;
    let src = tempfile::tempdir().unwrap();
    let (files, len) = (12, 2 << 20);
    for i in 0..files {
        write(
            &src.path().join(format!("t{i}.bin")),
            &random_bytes(len, 400 + i),
        );
    }
    let dsts: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let (wire, from_stores) = run_fan_out(&ca, &f, src.path(), &dsts, Duration::from_secs(5)).await;
    // Each live destination took the other's share from its store; the silent one's share
    // came from the source to both.
    let silent = files - from_stores;
    assert!(
        silent > 0 && silent < files,
        "{from_stores} tails from the fellow"
    );
    let from_source = (files + silent) * len as u64;
    assert!(
        wire >= from_source && wire < from_source + 2 * 256 * 1024,
        "the source sent {wire} bytes; {from_source} bytes of tails were not in a store"
    );
}

/// The destination of `n` that owns a pack whose first file is at `path`, by the rule every
/// receiver of a fan-out follows (docs/cas.md: the first 8 bytes of BLAKE3 of the path, mod n).
fn pack_owner(path: &str, n: u64) -> u64 {
    let h = blake3::hash(path.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(first) % n
}

/// Bytes of one pack of [`small_files_dataset`]: 204 files of 20 KiB (the most that fit 4 MiB).
const PACK_FILES: u64 = 204;
const PACK_FILE_LEN: usize = 20 * 1024;
const PACK_BYTES: u64 = PACK_FILES * PACK_FILE_LEN as u64;

/// A tree of small files that makes one pack per directory `p<k>`, owned by destination
/// `owners[k]` of `n`: every file of `p<k>` has a name that destination owns, so whichever the
/// walk meets first starts a pack that destination owns. Returns the bytes of the tree.
fn small_files_dataset(root: &Path, owners: &[u64], n: u64) -> u64 {
    for (k, &owner) in owners.iter().enumerate() {
        let names = (0u64..)
            .map(|i| format!("p{k}/img-{i:05}.jpg"))
            .filter(|p| pack_owner(p, n) == owner)
            .take(PACK_FILES as usize);
        for (i, name) in names.enumerate() {
            let seed = 1000 * (k as u64 + 1) + i as u64;
            write(&root.join(name), &random_bytes(PACK_FILE_LEN, seed));
        }
    }
    owners.len() as u64 * PACK_BYTES
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_fan_out_small_files_leave_the_source_once_as_packs() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let f = fan_out(&ca, 3).await;
    let src = tempfile::tempdir().unwrap();
    let bytes = small_files_dataset(src.path(), &[0, 1, 2], 3);
    let dsts: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (wire, from_stores) =
        run_fan_out(&ca, &f, src.path(), &dsts, Duration::from_secs(60)).await;
    eprintln!("{wire} bytes from the source for {bytes} bytes of small files");
    // Each pack crossed from the source once, to its owner; the two others took it from the
    // owner's store. Without packs the source sends three copies.
    assert_eq!(from_stores, 2 * 3, "packs taken from a fellow destination");
    assert!(
        wire >= bytes && wire < bytes + 3 * 256 * 1024,
        "the source sent {wire} bytes for {bytes} bytes of small files to 3 destinations"
    );
}

/// One sender for three destinations, as the operator's fan-out sender pod runs: the same
/// packs, one copy from the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sender_sends_each_pack_of_small_files_once() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let f = fan_out(&ca, 3).await;
    let src = tempfile::tempdir().unwrap();
    let bytes = small_files_dataset(src.path(), &[2, 0, 1], 3);
    let dsts: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let shared = Arc::new(SharedReads::new(dsts.len()));
    let o = SendOpts {
        compress: Compress::None,
        shared: Some(shared.clone()),
        ..Default::default()
    };
    let at: Vec<(usize, &Path)> = dsts.iter().map(|d| d.path()).enumerate().collect();
    let (wire, from_stores) =
        run_destinations_with(&ca, &f, src.path(), &at, Duration::from_secs(60), &o).await;
    assert_eq!(from_stores, 2 * 3, "packs taken from a fellow destination");
    assert!(
        wire >= bytes && wire < bytes + 3 * 256 * 1024,
        "the source sent {wire} bytes for {bytes} bytes of small files"
    );
    // Each pack was read and hashed once for the three sessions.
    let counts = shared.counts();
    assert_eq!(
        (counts.reads, counts.shared),
        (3, 6),
        "packs read from the source, and taken from another session's read"
    );
}

/// The pack a destination whose receiver never runs owns: the two others ask the sender for
/// it at the end (Refetch), finish in their first session, and hold the whole tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_left_to_a_destination_that_never_receives_comes_from_the_source() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let f = fan_out(&ca, 3).await;
    let src = tempfile::tempdir().unwrap();
    // Destination 2 owns the first pack and never receives.
    small_files_dataset(src.path(), &[2, 0, 1], 3);
    let dsts: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let (wire, from_stores) = run_fan_out(&ca, &f, src.path(), &dsts, Duration::from_secs(5)).await;
    // Each live one took the other's pack from its store; the silent one's came to both.
    assert_eq!(from_stores, 2, "packs taken from the live fellow");
    let from_source = 4 * PACK_BYTES;
    assert!(
        wire >= from_source && wire < from_source + 2 * 256 * 1024,
        "the source sent {wire} bytes; {from_source} bytes of packs were in no store"
    );
}

/// A scripted sender against a fan-out receiver (its only destination, so it owns every pack):
/// it offers two small files, announces them as a pack and answers the receiver's request for
/// the pack with bytes that are not the pack's. The receiver refuses the frame, writes neither
/// file, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_whose_bytes_do_not_match_its_hash_writes_none_of_its_files() {
    use ferry_mover::wire::{Message, caps};
    use ferry_proto::wire::v1 as wpb;
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let f = fan_out(&ca, 1).await;
    let dst = tempfile::tempdir().unwrap();
    let (pki, addr, recv) = fan_out_receiver(&ca, &f, 0, dst.path(), Duration::from_secs(5)).await;
    let all = caps::SUPPORTED | caps::DEDUP | caps::REFETCH | caps::TAILS | caps::PACKS;
    let stream = connect_as_sender(&pki, addr).await;
    let (mut reader, mut writer, welcome) = greet(
        stream,
        Duration::from_secs(10),
        hello(&pki.transfer, all, vec![5; 16], 0, 1),
    )
    .await;
    assert_eq!(
        welcome.capabilities & caps::PACKS,
        caps::PACKS,
        "a fan-out grants packs"
    );
    let (a, b) = (random_bytes(600 << 10, 1), random_bytes(600 << 10, 2));
    let entry = |path: &str, size: usize| wpb::Entry {
        path: path.as_bytes().to_vec(),
        kind: wpb::EntryKind::File as i32,
        mode: 0o644,
        size: size as u64,
        ..Default::default()
    };
    writer
        .send(&Message::Offer(wpb::Offer {
            offer_id: 1,
            entries: vec![entry("a.jpg", a.len()), entry("b.jpg", b.len())],
        }))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    let Message::Want(want) = reader.expect().await.unwrap() else {
        panic!("expected a Want");
    };
    let ids: Vec<u64> = want.entries.iter().map(|e| e.file_id).collect();
    let pack = [a.as_slice(), b.as_slice()].concat();
    let hash = blake3::hash(&pack).as_bytes().to_vec();
    writer
        .send(&Message::PackAnnounce(wpb::PackAnnounce {
            file_ids: ids.clone(),
            hash: hash.clone(),
            proof: vec![0; 32],
        }))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    let Message::NeedBlocks(nb) = reader.expect().await.unwrap() else {
        panic!("expected the pack's NeedBlocks");
    };
    assert_eq!(
        (nb.file_id, nb.need_blocks.as_slice()),
        (ids[0], &[1u8][..])
    );
    let mut forged = pack.clone();
    forged[700 << 10] ^= 1;
    writer
        .send(&Message::Pack {
            header: wpb::PackHeader {
                pack_id: ids[0],
                raw_len: pack.len() as u32,
                codec: 0,
                hash,
            },
            data: bytes::Bytes::from(forged),
        })
        .await
        .unwrap();
    writer.flush().await.unwrap();
    let err = recv.await.unwrap().expect_err("a forged pack is refused");
    assert!(err.contains("does not match its BLAKE3 hash"), "{err}");
    for name in ["a.jpg", "b.jpg"] {
        assert!(
            !dst.path().join(name).exists(),
            "{name} written from a forged pack"
        );
    }
}

/// Where a fetched block or pack goes in [`a_fellow_that_makes_no_pack_still_serves_its_blocks`].
struct Collect {
    path: Vec<u8>,
    pack: Option<Vec<ferry_mover::tree::peer_path::PeerPath>>,
    got: std::sync::Mutex<Vec<BlockHash>>,
}

impl node::swarm::FetchSink for Collect {
    fn deliver(
        &self,
        a: &ferry_mover::cas::dedup::AnnouncedBlock,
        _: bytes::Bytes,
    ) -> Result<(), String> {
        self.got.lock().unwrap().push(a.hash);
        Ok(())
    }
    fn file_id(&self) -> u64 {
        1
    }
    fn path(&self) -> &[u8] {
        &self.path
    }
    fn pack_paths(&self) -> Option<&[ferry_mover::tree::peer_path::PeerPath]> {
        self.pack.as_deref()
    }
}

/// A fellow destination that never makes a pack (it held some of the Offer's files already)
/// costs that pack's wait once: the pack is asked of the sender at the end, later packs it
/// owns are not waited for, and its blocks are still taken from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fellow_that_makes_no_pack_still_serves_its_blocks() {
    use ferry_mover::cas::dedup::AnnouncedBlock;
    use ferry_mover::tree::peer_path::PeerPath;
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let f = fan_out(&ca, 2).await;
    let pki = Pki::scoped(&ca, CLUSTER, "fan-d1-1", 1);
    let swarm = node::swarm::SwarmPeers::connect(
        &f.addrs,
        1,
        &[],
        &pki.files(Role::Receiver),
        Duration::from_secs(2),
    )
    .await
    .unwrap();
    let fetches = Arc::new(node::swarm::Fetches::new(Arc::new(swarm), true));
    // A pack and a block destination 0 owns; only the block is in its store.
    let pack_path = (0..)
        .map(|i| format!("p/{i}.jpg"))
        .find(|p| pack_owner(p, 2) == 0)
        .unwrap();
    assert_eq!(fetches.pack_owner(pack_path.as_bytes()), Some(0));
    let index = (0..2)
        .find(|&i| fetches.owner(b"big.bin", i) == Some(0))
        .unwrap();
    let block = random_bytes(BLOCK_SIZE, 77);
    let mut c = raw_client(&pki, Role::Receiver, &f.services[0])
        .await
        .unwrap();
    c.put(pb::PutRequest {
        hash: BlockHash::of(&block).as_bytes().to_vec(),
        data: block.clone().into(),
    })
    .await
    .unwrap();
    let key = PopKey::derive(&Nonce([3; 32]));
    let never = b"a pack nobody makes".repeat(100_000);
    let sink = |path: &str, pack: bool| {
        Arc::new(Collect {
            path: path.as_bytes().to_vec(),
            pack: pack.then(|| vec![PeerPath::parse(path.as_bytes()).unwrap()]),
            got: Default::default(),
        })
    };
    let pack_sink = sink(&pack_path, true);
    let pack = AnnouncedBlock {
        index: 0,
        hash: BlockHash::of(&never),
        proof: key.prove(&never),
    };
    let started = std::time::Instant::now();
    assert_eq!(fetches.admit(1), 1);
    fetches.start(&key, vec![(0, pack)], pack_sink.clone());
    let idle = fetches.clone();
    let orphans = tokio::task::spawn_blocking(move || idle.wait_idle())
        .await
        .unwrap()
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "waited {waited:?} for the pack"
    );
    assert_eq!(
        orphans.len(),
        1,
        "the pack is asked of the sender at the end"
    );
    assert_eq!(orphans[0].blocks, vec![pack]);
    assert!(pack_sink.got.lock().unwrap().is_empty());
    // Destination 0 owns no pack from now on, and still its blocks.
    assert_eq!(fetches.pack_owner(pack_path.as_bytes()), None);
    assert_eq!(fetches.owner(b"big.bin", index), Some(0));
    let block_sink = sink("big.bin", false);
    let announced = AnnouncedBlock {
        index,
        hash: BlockHash::of(&block),
        proof: key.prove(&block),
    };
    assert_eq!(fetches.admit(1), 1);
    fetches.start(&key, vec![(0, announced)], block_sink.clone());
    let idle = fetches.clone();
    let orphans = tokio::task::spawn_blocking(move || idle.wait_idle())
        .await
        .unwrap()
        .unwrap();
    assert!(orphans.is_empty());
    assert_eq!(*block_sink.got.lock().unwrap(), vec![BlockHash::of(&block)]);
}

/// Destinations that wanted only some of an Offer's small files (they hold the rest) get no
/// pack: every destination asks for what it lacks in Batch frames, as without a fan-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_holds_some_small_files_gets_the_others_in_batches() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let f = fan_out(&ca, 2).await;
    let src = tempfile::tempdir().unwrap();
    let bytes = small_files_dataset(src.path(), &[0, 1], 2);
    let dsts: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    // Both destinations already hold every tenth file (same content and mtime).
    let copy = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
        let mtime = std::fs::metadata(from).unwrap().modified().unwrap();
        std::fs::File::options()
            .write(true)
            .open(to)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    };
    for entry in files_under(src.path()).iter().step_by(10) {
        let rel = entry.strip_prefix(src.path()).unwrap();
        for d in &dsts {
            copy(entry, &d.path().join(rel));
        }
    }
    let (wire, from_stores) =
        run_fan_out(&ca, &f, src.path(), &dsts, Duration::from_secs(10)).await;
    assert_eq!(
        from_stores, 0,
        "no pack: every Offer had a file the destinations hold"
    );
    assert!(
        wire > bytes,
        "each destination got its missing files from the source: {wire} bytes"
    );
}

/// Not a test: times one 512 MiB file received without a store, through the node service and
/// into a local store, three rounds (docs/benchmarks.md, "Node service"). Run with
/// `cargo test --release -p ferry-mover --test node_service timing -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn timing_without_a_store_through_the_service_and_with_a_local_store() {
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let svc = start_node_service(&ca, 8 << 30).await;
    let o = SendOpts {
        compress: Compress::None,
        ..Default::default()
    };
    for round in 0..3 {
        let src = tempfile::tempdir().unwrap();
        write(
            &src.path().join("big.bin"),
            &random_bytes(512 << 20, 1000 + round),
        );
        let pki = Pki::scoped(&ca, CLUSTER, &format!("cost-{round}"), 1);
        let mut times = Vec::new();
        for how in 0..3 {
            let dst = tempfile::tempdir().unwrap();
            let store = tempfile::tempdir().unwrap();
            let t = std::time::Instant::now();
            let (addr, recv) = match how {
                0 => start_receiver(&pki, dst.path()).await,
                1 => {
                    start_receiver_with_service(&pki, dst.path(), client_for(&pki, &svc).await)
                        .await
                }
                _ => {
                    let local = ferry_mover::cas::CasStore::open(store.path(), 8 << 30).unwrap();
                    start_receiver_with_store(&pki, dst.path(), Some(std::sync::Arc::new(local)))
                        .await
                }
            };
            send(&pki, src.path(), addr, &o).await.unwrap();
            recv.await.unwrap().unwrap();
            times.push(t.elapsed());
            assert_same_tree(src.path(), dst.path());
        }
        eprintln!(
            "round {round}: no store {:?}, node service {:?}, local store {:?}",
            times[0], times[1], times[2]
        );
    }
}
