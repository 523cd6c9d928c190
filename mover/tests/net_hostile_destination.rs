//! Attacks on the sending side by a destination: a receiver that names a FIFO in a Refetch,
//! repeats a Refetch or refetches more than it was announced, a destination of a fan-out that
//! answers Busy for ever, a fellow destination's node service that repeats a block for ever,
//! and a single-file source swapped for a symlink once resolved. Each is performed for real; the
//! oracle is what the sender (or the fetching receiver) does: it ends with a clear error naming
//! the limit, within a bound, and reads nothing it was not meant to.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use ferry_mover::cas::BlockHash;
use ferry_mover::cas::dedup::AnnouncedBlock;
use ferry_mover::cas::pop::{Nonce, PopKey};
use ferry_mover::net::{self, Identity, Role};
use ferry_mover::node::swarm::{FetchSink, Fetches, SwarmPeers};
use ferry_mover::progress::Progress;
use ferry_mover::session::{FrameReader, FrameWriter, error_chain};
use ferry_mover::wire::{BLOCK_SIZE, Message, caps};
use ferry_proto::blockstore::v1 as bs;
use ferry_proto::wire::v1 as pb;
use futures::StreamExt as _;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

/// Short deadlines: a receiver that makes no progress for 2 s is cut off.
fn stall_timeouts() -> ferry_mover::session::Timeouts {
    ferry_mover::session::Timeouts {
        handshake: Duration::from_secs(3),
        idle: Duration::from_secs(10),
        progress: Duration::from_secs(2),
    }
}

/// Sends `src` to the fake receiver at the other end of `client`, and returns the error it must
/// fail with within 20 s.
async fn send_failing(src: &Path, client: DuplexStream) -> String {
    let cfg = ferry_mover::session::SenderConfig {
        root: src.to_owned(),
        transfer_id: "hostile".into(),
        compress: ferry_mover::session::Compress::None,
        delete: false,
        checksum: false,
        sync: false,
        bandwidth_limit: None,
        timeouts: stall_timeouts(),
        filter: Default::default(),
        dry_run: false,
        on_unreadable: Default::default(),
        shutdown: ferry_mover::session::Shutdown::never(),
        shared: None,
        source_file: None,
    };
    let progress = Arc::new(Progress::new("hostile", "sender"));
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        ferry_mover::session::send_session(&cfg, vec![client], progress),
    )
    .await
    .expect("the sender was held for 20 s");
    error_chain(&r.expect_err("the send must fail"))
}

/// What a fake receiver got after its Refetches: the Block and Pack frames.
#[derive(Debug, Default)]
struct Refetched {
    blocks: Vec<u64>,
    packs: usize,
}

/// A fake receiver holding the one stream of a session: it grants dedup and refetch, wants the
/// files whose path `wanted` accepts (whole, so their full blocks are announced to it) and
/// skips the others, takes every announced block "from its store", and after the sender's
/// Done sends `refetches`, one after the other, without waiting for their answers.
async fn refetching_receiver(
    server: DuplexStream,
    wanted: fn(&[u8]) -> bool,
    refetches: Vec<pb::Refetch>,
) -> Refetched {
    let (r, w) = tokio::io::split(server);
    let mut reader = FrameReader::new(r, 0, Duration::from_secs(30), Default::default());
    let mut writer = FrameWriter::new(w, 0, Duration::from_secs(30), Default::default());
    let Ok(Message::Hello(h)) = reader.expect().await else {
        panic!("no Hello");
    };
    let welcome = pb::Welcome {
        version: h.version,
        capabilities: h.capabilities & (caps::DEDUP | caps::REFETCH | caps::PROGRESS),
        session_id: h.session_id.clone(),
        stream_index: h.stream_index,
        block_size: h.block_size,
        dedup_nonce: vec![5; 32],
    };
    writer.send(&Message::Welcome(welcome)).await.unwrap();
    writer.flush().await.unwrap();
    let mut next_id = 1;
    loop {
        match reader.expect().await.unwrap() {
            Message::Offer(o) => {
                let entries = o
                    .entries
                    .iter()
                    .map(|e| {
                        next_id += 1;
                        pb::EntryWant {
                            skip: !wanted(&e.path),
                            file_id: next_id,
                            ..Default::default()
                        }
                    })
                    .collect();
                let want = pb::Want {
                    offer_id: o.offer_id,
                    entries,
                };
                writer.send(&Message::Want(want)).await.unwrap();
                writer.flush().await.unwrap();
            }
            // Every announced block is "taken from the store": none is needed.
            Message::BlockAnnounce(a) => {
                let nb = pb::NeedBlocks {
                    file_id: a.file_id,
                    need_blocks: Vec::new(),
                };
                writer.send(&Message::NeedBlocks(nb)).await.unwrap();
                writer.flush().await.unwrap();
            }
            Message::Done(_) => break,
            _ => {}
        }
    }
    for r in refetches {
        if writer.send(&Message::Refetch(r)).await.is_err() {
            break;
        }
    }
    let _ = writer.flush().await;
    let mut got = Refetched::default();
    while let Ok(Some(m)) = reader.next().await {
        match m {
            Message::Block { header, .. } => got.blocks.push(header.index),
            Message::Pack { .. } => got.packs += 1,
            Message::Error(_) => break,
            _ => {}
        }
    }
    got
}

/// A Refetch of blocks `indexes` of `path` in `src`, with their real hashes.
fn refetch_of(src: &Path, path: &str, indexes: &[u64]) -> pb::Refetch {
    let data = std::fs::read(src.join(path)).unwrap();
    pb::Refetch {
        file_id: 1,
        path: path.as_bytes().to_vec(),
        indexes: indexes.to_vec(),
        hashes: indexes
            .iter()
            .map(|&i| {
                let at = i as usize * BLOCK_SIZE;
                let block = &data[at..(at + BLOCK_SIZE).min(data.len())];
                blake3::hash(block).as_bytes().to_vec()
            })
            .collect(),
        pack: None,
    }
}

/// Opens a FIFO's write end when dropped, so that an open for reading blocked on it returns: a
/// sender that blocks makes its test fail, not hang.
struct ReleaseFifo(PathBuf);

impl Drop for ReleaseFifo {
    fn drop(&mut self) {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.0);
    }
}

/// A FIFO in the source is not part of the transfer (the walk leaves special files out), but a
/// receiver may name it in a Refetch, of blocks or of a pack. Opening it for reading would
/// wait for a writer for ever; the sender refuses it at once as not a regular file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refetch_naming_a_fifo_is_refused_without_blocking() {
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("a.txt"), b"hello");
    let fifo = src.path().join("pipe");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let _release = ReleaseFifo(fifo.clone());
    let blocks = pb::Refetch {
        file_id: 1,
        path: b"pipe".to_vec(),
        indexes: vec![0],
        hashes: vec![vec![0; 32]],
        pack: None,
    };
    let pack = pb::Refetch {
        pack: Some(pb::RefetchPack {
            pack_id: 1,
            paths: vec![b"pipe".to_vec()],
            hash: vec![0; 32],
        }),
        ..Default::default()
    };
    for (what, refetch) in [("blocks", blocks), ("a pack", pack)] {
        let (client, server) = tokio::io::duplex(1 << 20);
        let fake = tokio::spawn(refetching_receiver(server, |_| false, vec![refetch]));
        let err = send_failing(src.path(), client).await;
        let got = fake.await.unwrap();
        assert!(
            err.contains("not a regular file but a FIFO"),
            "{what}: {err}"
        );
        assert!(
            err.contains("pipe"),
            "{what}: the error names the file: {err}"
        );
        assert!(got.blocks.is_empty() && got.packs == 0, "{what}: {got:?}");
    }
}

/// Repeating one Refetch made the sender read and send the same block again and again. Each
/// block is sent again at most once per session; the second ask ends the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_is_refetched_at_most_once() {
    let src = tempfile::tempdir().unwrap();
    write(
        &src.path().join("model.bin"),
        &random_bytes(2 * BLOCK_SIZE, 1),
    );
    let again = refetch_of(src.path(), "model.bin", &[0]);
    let (client, server) = tokio::io::duplex(1 << 20);
    let fake = tokio::spawn(refetching_receiver(
        server,
        |_| true,
        vec![again.clone(); 20],
    ));
    let err = send_failing(src.path(), client).await;
    let got = fake.await.unwrap();
    assert!(
        err.contains("asks again for block 0 of model.bin")
            && err.contains("refetched at most once per session"),
        "{err}"
    );
    assert_eq!(got.blocks, [0], "the block was sent again more than once");
}

/// All the Refetches of a session together may not ask for more than the bytes announced to
/// the receiver: here 8 MiB (model.bin's two blocks). Its two blocks are sent again; a block
/// of a file the receiver skipped (never announced) is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refetches_stop_at_the_bytes_announced() {
    let src = tempfile::tempdir().unwrap();
    write(
        &src.path().join("model.bin"),
        &random_bytes(2 * BLOCK_SIZE, 2),
    );
    write(
        &src.path().join("other.bin"),
        &random_bytes(2 * BLOCK_SIZE, 3),
    );
    let refetches = vec![
        refetch_of(src.path(), "model.bin", &[0, 1]),
        refetch_of(src.path(), "other.bin", &[0]),
    ];
    let (client, server) = tokio::io::duplex(1 << 20);
    let fake = tokio::spawn(refetching_receiver(
        server,
        |path| path == b"model.bin",
        refetches,
    ));
    let err = send_failing(src.path(), client).await;
    let got = fake.await.unwrap();
    assert!(
        err.contains(&format!("more than the {} bytes", 2 * BLOCK_SIZE)),
        "{err}"
    );
    assert_eq!(got.blocks, [0, 1], "{got:?}");
}

/// A fake receiver for TLS connections on 127.0.0.1 that greets each stream and then only
/// sends Busy frames with a growing work counter, every 250 ms, for ever. Its address.
async fn busy_for_ever(pki: &Pki) -> String {
    let files = pki.files(Role::Receiver);
    let server = net::server_config(&files, &[Role::Sender]).unwrap();
    let tls = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let tls = tls.clone();
            tokio::spawn(async move {
                let Ok(stream) = tls.accept(tcp).await else {
                    return;
                };
                let (r, w) = tokio::io::split(stream);
                let mut reader =
                    FrameReader::new(r, 0, Duration::from_secs(60), Default::default());
                let mut writer =
                    FrameWriter::new(w, 0, Duration::from_secs(60), Default::default());
                let Ok(Message::Hello(h)) = reader.expect().await else {
                    return;
                };
                let welcome = pb::Welcome {
                    version: h.version,
                    capabilities: h.capabilities & caps::PROGRESS,
                    session_id: h.session_id.clone(),
                    stream_index: h.stream_index,
                    block_size: h.block_size,
                    dedup_nonce: Vec::new(),
                };
                if writer.send(&Message::Welcome(welcome)).await.is_err()
                    || writer.flush().await.is_err()
                {
                    return;
                }
                tokio::spawn(async move { while let Ok(Some(_)) = reader.next().await {} });
                let mut work = 0;
                loop {
                    work += 1_000_000;
                    let busy = Message::Busy(pb::Busy { work });
                    if writer.send(&busy).await.is_err() || writer.flush().await.is_err() {
                        return;
                    }
                    // The attack's pace (well inside the idle timeout), not synchronization.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            });
        }
    });
    addr
}

/// One sender, two destinations (`send --connect A --connect B`): A is honest, B answers Busy
/// with a growing counter for ever. B's session fails alone, at its progress deadline as Busy
/// frames may stretch it (four timeouts for so small a source), naming B; A gets the tree, and
/// the sender exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_busy_for_ever_fails_alone_while_the_others_finish() {
    let pki = pki("fan-busy");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write(&src.join("a.txt"), b"hello");
    write(&src.join("big.bin"), &random_bytes(BLOCK_SIZE + 1000, 4));
    let dst = tmp.path().join("dst");
    std::fs::create_dir_all(&dst).unwrap();
    let (mut honest, honest_addr, _stdout) = spawn_receiver(&pki, &dst, &[]);
    let busy_addr = busy_for_ever(&pki).await;
    let child = std::process::Command::new(BIN)
        .args([
            "send",
            "--json",
            "--streams",
            "1",
            "--progress-timeout",
            "1",
        ])
        .args(["--connect", &honest_addr, "--connect", &busy_addr])
        .arg("--root")
        .arg(&src)
        .args(pki.args("sender"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(40)))
        .await
        .unwrap();
    let out = match out {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // Ours to end: the sender this test started.
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid as i32).unwrap(),
                rustix::process::Signal::KILL,
            );
            panic!("the sender was held for 40 s by a destination answering Busy for ever");
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        honest.wait().unwrap().success(),
        "the honest receiver failed"
    );
    assert_same_tree(&src, &dst);
    assert_eq!(
        out.status.code(),
        Some(i32::from(ferry_mover::kind::exit_status(
            ferry_mover::kind::ErrorKind::Timeout,
            false
        ))),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("to {busy_addr}:")) && stderr.contains("only Busy frames"),
        "the failure names the busy destination and why:\n{stderr}"
    );
    let summaries: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert_eq!(summaries[0]["destination"], honest_addr.as_str());
}

/// A TLS connection as tonic serves it (the fake service needs no client identity).
struct Conn(tokio_rustls::server::TlsStream<tokio::net::TcpStream>);

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Most blocks the repeating service sends on one Take (the attack needs no more to show).
const REPEATS: u64 = 300;

/// A fellow destination's node service that answers every Take with its first block, valid,
/// over and over (up to [`REPEATS`] times); `sent` counts the blocks it handed over.
struct Repeating {
    block: Bytes,
    sent: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl bs::block_store_server::BlockStore for Repeating {
    type TakeStream =
        Pin<Box<dyn futures::Stream<Item = Result<bs::TakenBlock, tonic::Status>> + Send>>;

    async fn take(
        &self,
        _req: tonic::Request<bs::TakeRequest>,
    ) -> Result<tonic::Response<Self::TakeStream>, tonic::Status> {
        let (block, sent) = (self.block.clone(), self.sent.clone());
        let stream = futures::stream::iter(0..REPEATS).map(move |_| {
            sent.fetch_add(1, Ordering::SeqCst);
            Ok(bs::TakenBlock {
                position: 0,
                data: block.clone(),
                more: false,
            })
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    async fn put(
        &self,
        _req: tonic::Request<bs::PutRequest>,
    ) -> Result<tonic::Response<bs::PutReply>, tonic::Status> {
        Err(tonic::Status::unimplemented("no puts here"))
    }

    async fn stats(
        &self,
        _req: tonic::Request<bs::StatsRequest>,
    ) -> Result<tonic::Response<bs::StoreStats>, tonic::Status> {
        Err(tonic::Status::unimplemented("no stats here"))
    }
}

/// Serves `service` on 127.0.0.1 with a node service certificate of `ca` for `cluster`.
async fn serve_node(
    ca: &net::Ca,
    cluster: &str,
    service: Repeating,
) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca
        .issue_for(&Identity::node_service(cluster).unwrap())
        .unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca.cert_pem()).unwrap();
    std::fs::write(dir.path().join("node.crt"), cert).unwrap();
    std::fs::write(dir.path().join("node.key"), key).unwrap();
    let files = net::load_files(
        &dir.path().join("ca.crt"),
        &dir.path().join("node.crt"),
        &dir.path().join("node.key"),
        net::NODE_SERVICE_ID,
        Role::Node,
    )
    .unwrap();
    let tls = tokio_rustls::TlsAcceptor::from(Arc::new(net::node_server_config(&files).unwrap()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Conn, std::io::Error>>(4);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            if let Ok(tls) = tls.accept(tcp).await
                && tx.send(Ok(Conn(tls))).await.is_err()
            {
                return;
            }
        }
    });
    let incoming = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|conn| (conn, rx))
    });
    let server = bs::block_store_server::BlockStoreServer::new(service)
        .max_encoding_message_size(ferry_mover::node::MAX_MESSAGE)
        .max_decoding_message_size(ferry_mover::node::MAX_MESSAGE);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming(incoming),
    );
    (addr, dir)
}

/// Where the fetched blocks go: each delivery, by index.
#[derive(Default)]
struct Deliveries(Mutex<Vec<u64>>);

impl FetchSink for Deliveries {
    fn deliver(&self, announced: &AnnouncedBlock, _block: Bytes) -> Result<(), String> {
        self.0.lock().unwrap().push(announced.index);
        Ok(())
    }
    fn file_id(&self) -> u64 {
        1
    }
    fn path(&self) -> &[u8] {
        b"model.bin"
    }
}

/// A fellow destination's service answers a Take of two blocks with the first one, valid,
/// over and over. It used to be skipped as delivered while the loop went on for as long as
/// the service liked; now the Take may bring each block once and one repeat, after which the
/// peer counts as failed: the block it did not deliver is an orphan (asked of the sender), and
/// the peer owns nothing from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sibling_repeating_a_block_for_ever_counts_as_failed() {
    const CLUSTER: &str = "test";
    let ca = net::Ca::new("ferry test", 1).unwrap();
    let pki = Pki::scoped(&ca, CLUSTER, "swarm-1", 1);
    let blocks: Vec<Vec<u8>> = (0..2).map(|i| random_bytes(BLOCK_SIZE, 10 + i)).collect();
    let sent = Arc::new(AtomicU64::new(0));
    let service = Repeating {
        block: Bytes::from(blocks[0].clone()),
        sent: sent.clone(),
    };
    let (addr, _certs) = serve_node(&ca, CLUSTER, service).await;
    let peers = SwarmPeers::connect(
        &[addr, "me".into()],
        1,
        &[],
        &pki.files(Role::Receiver),
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    let fetches = Arc::new(Fetches::new(Arc::new(peers), true));
    let owned_by_peer = |f: &Fetches| {
        (0..8)
            .filter(|&i| f.owner(b"model.bin", i) == Some(0))
            .count()
    };
    assert!(owned_by_peer(&fetches) > 0, "the peer owns blocks");
    let key = PopKey::derive(&Nonce([7; 32]));
    let announced: Vec<AnnouncedBlock> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| AnnouncedBlock {
            index: i as u64,
            hash: BlockHash::of(b),
            proof: key.prove(b),
        })
        .collect();
    let sink = Arc::new(Deliveries::default());
    assert_eq!(fetches.admit(2), 2);
    fetches.start(
        &key,
        announced.iter().map(|a| (0, *a)).collect(),
        sink.clone(),
    );
    let f = fetches.clone();
    let orphans = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || f.wait_idle()),
    )
    .await
    .expect("the fetch was held for 60 s")
    .unwrap()
    .expect("with refetch a failed peer fails nothing");
    let sent = sent.load(Ordering::SeqCst);
    // The client reads the first block and two repeats, and the one past the budget; a few
    // more may be in flight when it hangs up.
    assert!(
        sent <= 8,
        "the repeating service handed over {sent} blocks for a Take of 2"
    );
    assert_eq!(*sink.0.lock().unwrap(), [0], "block 0 is written once");
    assert_eq!(orphans.len(), 1);
    let left: Vec<u64> = orphans[0].blocks.iter().map(|b| b.index).collect();
    assert_eq!(left, [1], "the undelivered block is asked of the sender");
    assert_eq!(
        owned_by_peer(&fetches),
        0,
        "the failed peer owns nothing now"
    );
}

/// A relay on a free loopback port in front of `target` for one connection: it runs `between`
/// once the connection came (the sender has resolved its source by then), and then lets it
/// through.
fn relay_after(target: String, between: impl FnOnce() + Send + 'static) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let Ok((client, _)) = listener.accept() else {
            return;
        };
        between();
        let server = std::net::TcpStream::connect(&target).unwrap();
        let pipe = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(std::net::Shutdown::Write);
        };
        let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || pipe(s2, c2));
        pipe(client, server);
    });
    addr
}

/// A sub path naming a single file is swapped for a symlink to a directory outside the root
/// after the sender resolved it, before it walks (the sender connects only once its source is
/// resolved, and the relay lets the connection through only after the swap). The sender sends
/// the file it resolved, from its handle; the directory behind the symlink is never read.
#[test]
fn a_single_file_swapped_for_a_symlink_once_resolved_is_still_the_one_sent() {
    let pki = pki("single-swap");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let content = random_bytes(300_000, 5);
    write(&src.join("d/model.bin"), &content);
    let outside = tmp.path().join("outside");
    write(&outside.join("secret"), b"not for the destination");
    let dst = tmp.path().join("dst");
    std::fs::create_dir_all(&dst).unwrap();
    let (mut recv, addr, _out) = spawn_receiver(&pki, &dst, &[]);
    let (d, out) = (src.join("d"), outside.clone());
    let relay = relay_after(addr, move || {
        std::fs::rename(d.join("model.bin"), d.join("model.old")).unwrap();
        std::os::unix::fs::symlink(&out, d.join("model.bin")).unwrap();
    });
    let send = run_sender(
        &pki,
        &src,
        &relay,
        &["--streams", "1", "--sub-path", "d/model.bin"],
    );
    assert!(
        send.status.success(),
        "{}",
        String::from_utf8_lossy(&send.stderr)
    );
    assert!(recv.wait().unwrap().success());
    assert!(
        std::fs::symlink_metadata(src.join("d/model.bin"))
            .unwrap()
            .is_symlink(),
        "the swap happened"
    );
    assert!(std::fs::read(dst.join("model.bin")).unwrap() == content);
    let names: Vec<_> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with(".ferry"))
        .collect();
    assert_eq!(names, ["model.bin"], "nothing from behind the symlink");
}
