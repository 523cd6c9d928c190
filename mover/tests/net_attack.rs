//! Attacks on the receiver by a session of the same transfer, each performed by a scripted peer
//! that speaks the codec directly, followed by an honest transfer. Oracle: a file at its final
//! path always holds the sender's content, and the receiver's digest describes what it holds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use ferry_mover::progress::Progress;
use ferry_mover::session::{
    FrameReader, FrameWriter, ReceiverConfig, accept_stream, error_chain, receive_session,
};
use ferry_mover::wire::{BLOCK_SIZE, Message, caps, codec};
use ferry_proto::wire::v1 as pb;
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};

type Reader = FrameReader<ReadHalf<DuplexStream>>;
type Writer = FrameWriter<WriteHalf<DuplexStream>>;

/// A hostile peer holding one stream of a session with an in-process receiver of `transfer` on
/// `root`, past Hello/Welcome.
struct Peer {
    reader: Reader,
    writer: Writer,
    receiver: tokio::task::JoinHandle<Result<(), String>>,
}

async fn connect(root: &Path, transfer: &str, want_caps: u64) -> Peer {
    connect_with(root, transfer, want_caps, fast_timeouts()).await
}

async fn connect_with(
    root: &Path,
    transfer: &str,
    want_caps: u64,
    timeouts: ferry_mover::session::Timeouts,
) -> Peer {
    let (client, server) = tokio::io::duplex(32 * 1024 * 1024);
    let cfg = ReceiverConfig {
        root: root.to_owned(),
        transfer_id: transfer.into(),
        timeouts,
        sync: false,
        cas: None,
        block_service: None,
        swarm: None,
        identity: None,
        keep: Default::default(),
        shutdown: ferry_mover::session::Shutdown::never(),
    };
    let receiver = tokio::spawn(async move {
        let progress = Arc::new(Progress::new(&cfg.transfer_id, "receiver"));
        let acc = accept_stream(server, &cfg, progress.wire_bytes.clone(), 0)
            .await
            .map_err(|e| error_chain(&e))?;
        receive_session(&cfg, vec![acc], progress)
            .await
            .map(|_| ())
            .map_err(|e| error_chain(&e))
    });
    let (reader, writer, _) = greet(
        client,
        Duration::from_secs(10),
        hello(transfer, want_caps, vec![7; 16], 0, 1),
    )
    .await;
    Peer {
        reader,
        writer,
        receiver,
    }
}

impl Peer {
    /// Offers `entry` and returns the receiver's answer for it.
    async fn offer(&mut self, entry: pb::Entry) -> pb::EntryWant {
        let offer = Message::Offer(pb::Offer {
            offer_id: 1,
            entries: vec![entry],
        });
        self.writer.send(&offer).await.unwrap();
        self.writer.flush().await.unwrap();
        loop {
            match self.reader.expect().await.unwrap() {
                Message::Want(mut w) => return w.entries.remove(0),
                Message::Keepalive => {}
                other => panic!("expected Want, got {other:?}"),
            }
        }
    }

    /// Sends one raw block with a correct hash of `data`.
    async fn block(&mut self, file_id: u64, index: u64, data: &[u8]) {
        let m = Message::Block {
            header: pb::BlockHeader {
                file_id,
                index,
                raw_len: data.len() as u32,
                codec: codec::RAW,
                hash: blake3::hash(data).as_bytes().to_vec(),
            },
            data: Bytes::copy_from_slice(data),
        };
        self.writer.send(&m).await.unwrap();
        self.writer.flush().await.unwrap();
    }

    /// Disconnects mid-session and waits for the receiver to give up.
    async fn disconnect(self) -> String {
        let Peer {
            reader,
            mut writer,
            receiver,
        } = self;
        writer.shutdown().await;
        drop(writer);
        drop(reader);
        match tokio::time::timeout(Duration::from_secs(30), receiver)
            .await
            .expect("receiver ends")
            .unwrap()
        {
            Ok(()) => "OK".into(),
            Err(e) => e,
        }
    }
}

/// The Offer entry an honest sender makes for `path` under `src`.
fn entry_of(src: &Path, path: &str) -> pb::Entry {
    let md = std::fs::metadata(src.join(path)).unwrap();
    pb::Entry {
        path: path.into(),
        kind: pb::EntryKind::File as i32,
        mode: md.mode() & 0o777,
        mtime_sec: md.mtime(),
        mtime_nsec: md.mtime_nsec() as u32,
        size: md.len(),
        ..Default::default()
    }
}

const MIB: usize = 1024 * 1024;

/// Block 0 random, block 1 all zeros, block 2 random, a short tail.
fn source_with_a_zero_block(src: &Path) -> Vec<u8> {
    let mut content = random_bytes(4 * MIB, 1);
    content.extend(vec![0u8; 4 * MIB]);
    content.extend(random_bytes(4 * MIB + 333, 2));
    write(&src.join("big.bin"), &content);
    content
}

/// Waits (at most 30 s) until block `index` holding `block` is in the receiver's staging: the
/// part file has its bytes and the manifest (`FERRYMF2` header, then one 32-byte record per
/// block) has a record for it. A disconnect before that would test nothing.
async fn wait_until_staged(dst: &Path, index: u64, block: &[u8]) {
    use std::os::unix::fs::FileExt;
    let held = || {
        let files = files_under(&dst.join(".ferry-staging"));
        let part = files.iter().any(|f| {
            let mut buf = vec![0u8; block.len()];
            std::fs::File::open(f)
                .and_then(|h| h.read_exact_at(&mut buf, index * BLOCK_SIZE as u64))
                .is_ok_and(|()| buf == block)
        });
        let recorded = files.iter().any(|f| {
            let Ok(data) = std::fs::read(f) else {
                return false;
            };
            if !data.starts_with(b"FERRYMF2") || data.len() < 32 {
                return false;
            }
            let path_len = u32::from_le_bytes([data[28], data[29], data[30], data[31]]) as usize;
            let at = 32 + path_len + 32 * index as usize;
            data.get(at..at + 32)
                .is_some_and(|r| r.iter().any(|&b| b != 0))
        });
        part && recorded
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !held() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "block {index} never reached staging"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A session of the same transfer sends attacker bytes (with their correct hash) for block
/// `index` of a file the source really has, with its size and mtime, then disconnects.
async fn poison(dst: &Path, src: &Path, transfer: &str, index: u64) {
    let mut peer = connect(dst, transfer, caps::SUPPORTED).await;
    let want = peer.offer(entry_of(src, "big.bin")).await;
    assert!(!want.skip);
    let evil = random_bytes(BLOCK_SIZE, 666);
    peer.block(want.file_id, index, &evil).await;
    // The receiver must hold it before the connection drops, or the rerun proves nothing.
    wait_until_staged(dst, index, &evil).await;
    let err = peer.disconnect().await;
    assert_ne!(err, "OK");
    assert!(
        !dst.join("big.bin").exists(),
        "nothing at the final path yet"
    );
}

fn assert_no_attacker_block(file: &Path) {
    let evil = random_bytes(BLOCK_SIZE, 666);
    let data = std::fs::read(file).unwrap();
    assert!(
        !data.chunks(BLOCK_SIZE).any(|c| c == evil.as_slice()),
        "attacker's block in {}",
        file.display()
    );
}

/// The receiver's digest over what it committed equals its digest over what it holds (a rerun
/// that skips everything reads the destination for its digest).
async fn assert_digest_describes_what_is_held(pki: &Pki, src: &Path, dst: &Path, first: &str) {
    let (_, again) = round_trip(pki, src, dst, &SendOpts::default()).await;
    assert_eq!(again.files, 0, "rerun skips everything");
    assert_eq!(
        again.digest, first,
        "the digest reported at commit differs from the digest of what the receiver holds"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poisoned_block_from_an_earlier_session_never_reaches_the_final_file() {
    let pki = pki("poison-resume");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let content = random_bytes(12 * MIB + 4321, 5);
    write(&src.path().join("big.bin"), &content);
    poison(dst.path(), src.path(), &pki.transfer, 0).await;

    let (sent, received) = round_trip(&pki, src.path(), dst.path(), &SendOpts::default()).await;
    assert_eq!(
        std::fs::read(dst.path().join("big.bin")).unwrap(),
        content,
        "final file holds the sender's content"
    );
    assert_eq!(
        received.resumed_bytes, 0,
        "the attacker's block was not kept"
    );
    assert_eq!(sent.digest, received.digest);
    assert_digest_describes_what_is_held(&pki, src.path(), dst.path(), &received.digest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_bytes_in_a_reused_staging_file_do_not_survive_a_zero_block() {
    let pki = pki("poison-zero");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let content = source_with_a_zero_block(src.path());
    // The attacker fills the block the source has as zeros.
    poison(dst.path(), src.path(), &pki.transfer, 1).await;

    let (sent, received) = round_trip(&pki, src.path(), dst.path(), &SendOpts::default()).await;
    let got = std::fs::read(dst.path().join("big.bin")).unwrap();
    assert_no_attacker_block(&dst.path().join("big.bin"));
    assert!(got == content, "final file holds the sender's content");
    assert_eq!(sent.digest, received.digest);
    assert_digest_describes_what_is_held(&pki, src.path(), dst.path(), &received.digest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn honest_blocks_left_by_an_interrupted_session_are_resumed() {
    let pki = pki("resume-honest");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let content = source_with_a_zero_block(src.path());
    // An interrupted run wrote the real block 2.
    let mut peer = connect(dst.path(), &pki.transfer, caps::SUPPORTED).await;
    let want = peer.offer(entry_of(src.path(), "big.bin")).await;
    peer.block(want.file_id, 2, &content[8 * MIB..12 * MIB])
        .await;
    wait_until_staged(dst.path(), 2, &content[8 * MIB..12 * MIB]).await;
    peer.disconnect().await;

    let (sent, received) = round_trip(&pki, src.path(), dst.path(), &SendOpts::default()).await;
    assert_eq!(std::fs::read(dst.path().join("big.bin")).unwrap(), content);
    assert_eq!(
        received.resumed_bytes,
        4 * MIB as u64,
        "the real block was kept"
    );
    assert_eq!(sent.digest, received.digest);
}

/// A staging pair forged on disk (manifest records whose hashes match the forged bytes) is not
/// trusted either. The manifest format is the current one (docs/protocol.md, "Resume").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forged_part_and_manifest_on_disk_are_not_trusted() {
    let pki = pki("forged-staging");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let content = source_with_a_zero_block(src.path());
    let e = entry_of(src.path(), "big.bin");
    let key = blake3::hash(b"big.bin").to_hex();
    let dir = dst.path().join(".ferry-staging").join(&pki.transfer);
    std::fs::create_dir_all(&dir).unwrap();
    let evil = random_bytes(BLOCK_SIZE, 666);
    let mut part = vec![0u8; content.len()];
    for b in 0..3 {
        part[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE].copy_from_slice(&evil);
    }
    let mut manifest = b"FERRYMF2".to_vec();
    manifest.extend(e.size.to_le_bytes());
    manifest.extend(e.mtime_sec.to_le_bytes());
    manifest.extend(e.mtime_nsec.to_le_bytes());
    manifest.extend((e.path.len() as u32).to_le_bytes());
    manifest.extend(&e.path);
    for _ in 0..3 {
        manifest.extend(blake3::hash(&evil).as_bytes());
    }
    manifest.extend(blake3::hash(&part[3 * BLOCK_SIZE..]).as_bytes());
    std::fs::write(dir.join(format!("{}.part", &key.as_str()[..32])), &part).unwrap();
    std::fs::write(
        dir.join(format!("{}.manifest", &key.as_str()[..32])),
        &manifest,
    )
    .unwrap();

    let (sent, received) = round_trip(&pki, src.path(), dst.path(), &SendOpts::default()).await;
    assert_no_attacker_block(&dst.path().join("big.bin"));
    assert!(std::fs::read(dst.path().join("big.bin")).unwrap() == content);
    assert_eq!(sent.digest, received.digest);
}

/// A Block frame that fails validation (its hash does not match its data) followed by silence
/// is answered with an Error at once, not when the next frame or the idle timeout comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_block_followed_by_silence_is_answered_at_once() {
    let pki = pki("bad-block-silence");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(&src.path().join("big.bin"), &random_bytes(6 * MIB, 3));
    let mut peer = connect(dst.path(), &pki.transfer, caps::SUPPORTED).await;
    let want = peer.offer(entry_of(src.path(), "big.bin")).await;
    assert!(!want.skip);
    let data = random_bytes(BLOCK_SIZE, 4);
    let bad = Message::Block {
        header: pb::BlockHeader {
            file_id: want.file_id,
            index: 0,
            raw_len: data.len() as u32,
            codec: codec::RAW,
            hash: blake3::hash(b"something else").as_bytes().to_vec(),
        },
        data: Bytes::copy_from_slice(&data),
    };
    let sent = tokio::time::Instant::now();
    peer.writer.send(&bad).await.unwrap();
    peer.writer.flush().await.unwrap();
    // Nothing more is sent; the answer must come well before the 10 s idle timeout.
    let deadline = sent + Duration::from_secs(2);
    let error = loop {
        match tokio::time::timeout_at(deadline, peer.reader.expect()).await {
            Err(_) => panic!("no Error within 2 s of a bad Block frame"),
            Ok(Ok(Message::Error(e))) => break e,
            Ok(Ok(Message::Keepalive | Message::Busy(_))) => {}
            Ok(other) => panic!("expected Error, got {other:?}"),
        }
    };
    assert_eq!(error.kind, pb::ErrorKind::Peer as i32, "{error:?}");
    assert!(error.message.contains("big.bin"), "{error:?}");
    let r = tokio::time::timeout(Duration::from_secs(5), peer.receiver)
        .await
        .expect("the receiver ends")
        .unwrap();
    assert!(r.is_err(), "the receiver failed the session");
}

/// The staging manifest header of `e` (docs/protocol.md, "Resume"), with no block recorded.
fn manifest_header(e: &pb::Entry) -> Vec<u8> {
    let mut m = b"FERRYMF2".to_vec();
    m.extend(e.size.to_le_bytes());
    m.extend(e.mtime_sec.to_le_bytes());
    m.extend(e.mtime_nsec.to_le_bytes());
    m.extend((e.path.len() as u32).to_le_bytes());
    m.extend(&e.path);
    m
}

/// Hard links planted in `.ferry-staging/<id>/` to files outside the root, as a part file and
/// as the manifest of a resumable transfer (a header that matches), and (as root) a part file of
/// another owner: the receiver discards and recreates them, never writes through them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn staging_files_linked_outside_or_owned_by_another_are_never_written_through() {
    use std::os::unix::fs::MetadataExt;
    let pki = pki("staging-links");
    let src = tempfile::tempdir().unwrap();
    // The destination and the victims on one file system, so hard links can be made.
    let base = tempfile::tempdir().unwrap();
    let (dst, outside) = (base.path().join("dst"), base.path().join("outside"));
    let names = ["a.bin", "b.bin", "c.bin"];
    for (i, name) in names.iter().enumerate() {
        write(
            &src.path().join(name),
            &random_bytes(5 * MIB + 7, 20 + i as u64),
        );
    }
    let dir = dst.join(".ferry-staging").join(&pki.transfer);
    std::fs::create_dir_all(&dir).unwrap();
    let staged = |name: &str, ext: &str| {
        let key = blake3::hash(name.as_bytes()).to_hex();
        dir.join(format!("{}.{ext}", &key.as_str()[..32]))
    };
    // a.bin: its part file is a hard link to a victim outside.
    let victim_part = random_bytes(3 * MIB, 77);
    write(&outside.join("victim-part"), &victim_part);
    std::fs::hard_link(outside.join("victim-part"), staged("a.bin", "part")).unwrap();
    // b.bin: its manifest is a hard link to a victim that holds a matching header, so the
    // receiver would resume with it and record block hashes into it.
    let victim_manifest = manifest_header(&entry_of(src.path(), "b.bin"));
    write(&outside.join("victim-manifest"), &victim_manifest);
    std::fs::hard_link(outside.join("victim-manifest"), staged("b.bin", "manifest")).unwrap();
    // c.bin: a part file of another owner (only root can plant one; as another user the two
    // links above are the whole test).
    let root = rustix::process::geteuid().is_root();
    if root {
        write(&staged("c.bin", "part"), b"someone else's");
        std::os::unix::fs::chown(staged("c.bin", "part"), Some(NOBODY), Some(NOBODY)).unwrap();
    }

    let (sent, received) = round_trip(&pki, src.path(), &dst, &SendOpts::default()).await;
    assert!(
        std::fs::read(outside.join("victim-part")).unwrap() == victim_part,
        "wrote through a part file linked outside the root"
    );
    assert!(
        std::fs::read(outside.join("victim-manifest")).unwrap() == victim_manifest,
        "wrote through a manifest linked outside the root"
    );
    for (i, name) in names.iter().enumerate() {
        assert!(
            std::fs::read(dst.join(name)).unwrap() == random_bytes(5 * MIB + 7, 20 + i as u64),
            "{name} differs"
        );
        let md = std::fs::metadata(dst.join(name)).unwrap();
        assert_eq!(md.nlink(), 1, "{name} is still linked to a victim");
        assert_eq!(
            md.uid(),
            rustix::process::geteuid().as_raw(),
            "{name}: another owner's staging file became the destination file"
        );
    }
    assert_eq!(sent.digest, received.digest);
}

/// Every regular file under `dir` (staging included).
fn all_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.extend(all_files(&e.path()));
            } else if ft.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

/// A parent directory of a large file is swapped for a symlink to a directory outside the
/// source root while its blocks are being sent: no block may come from outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_parent_swapped_for_a_symlink_mid_send_reads_nothing_outside_the_root() {
    let pki = pki("swap-parent");
    let base = tempfile::tempdir().unwrap();
    let src = base.path().join("src");
    let outside = base.path().join("outside");
    let dst = tempfile::tempdir().unwrap();
    let content = random_bytes(6 * BLOCK_SIZE, 11);
    write(&src.join("d/big.bin"), &content);
    let secret = random_bytes(6 * BLOCK_SIZE, 99);
    write(&outside.join("big.bin"), &secret);

    // Swap once the receiver has the first block in staging.
    let staging = dst.path().join(".ferry-staging").join(&pki.transfer);
    let (s, o) = (src.clone(), outside.clone());
    let swapper = std::thread::spawn(move || {
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            let written: u64 = all_files(&staging)
                .iter()
                .filter(|p| p.extension().is_some_and(|x| x == "part"))
                .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
                .sum();
            if written > 0 {
                std::fs::rename(s.join("d"), s.join("d.orig")).unwrap();
                std::os::unix::fs::symlink(&o, s.join("d")).unwrap();
                return true;
            }
            // Poll interval of a condition wait with a deadline, not synchronization.
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    });
    let opts = SendOpts {
        streams: 1,
        compress: ferry_mover::session::Compress::None,
        bandwidth_limit: Some(6_000_000),
        ..Default::default()
    };
    let (addr, recv) = start_receiver(&pki, dst.path()).await;
    let sent = send(&pki, &src, addr, &opts).await;
    let received = recv.await.unwrap();
    assert!(swapper.join().unwrap(), "the swap happened mid-send");
    for f in all_files(dst.path()) {
        let data = std::fs::read(&f).unwrap();
        for (i, block) in secret.chunks(BLOCK_SIZE).enumerate() {
            assert!(
                !data.chunks(BLOCK_SIZE).any(|c| c == block),
                "block {i} of a file outside the source root reached {}",
                f.display()
            );
        }
    }
    // The file already open is sent whole from its own handle.
    sent.expect("send");
    received.expect("receive");
    assert!(std::fs::read(dst.path().join("d/big.bin")).unwrap() == content);
}

/// Short deadlines: a peer that makes no progress for 2 s is cut off (idle is longer, so only
/// the progress deadline can end these sessions).
fn stall_timeouts() -> ferry_mover::session::Timeouts {
    ferry_mover::session::Timeouts {
        handshake: Duration::from_secs(3),
        idle: Duration::from_secs(10),
        progress: Duration::from_secs(2),
    }
}

/// What a sender that holds the session without moving anything can do: keepalives only, a
/// frame trickled a byte at a time, Busy frames whose work counter never grows, Busy frames
/// whose counter grows (Busy proves nothing), and Busy frames without the progress capability.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_authenticated_sender_that_makes_no_progress_is_cut_off() {
    let dst = tempfile::tempdir().unwrap();
    let offer = {
        let mut b = bytes::BytesMut::new();
        Message::Offer(pb::Offer {
            offer_id: 1,
            entries: vec![pb::Entry {
                path: "x".into(),
                kind: pb::EntryKind::File as i32,
                size: 5,
                ..Default::default()
            }],
        })
        .encode(&mut b)
        .unwrap();
        b.to_vec()
    };
    for attack in [
        "keepalives",
        "trickle",
        "busy without work",
        "busy with growing work",
        "busy without the capability",
    ] {
        let offered = match attack {
            "busy without the capability" => caps::SUPPORTED & !caps::PROGRESS,
            _ => caps::SUPPORTED,
        };
        let peer = connect_with(dst.path(), "stall", offered, stall_timeouts()).await;
        let started = std::time::Instant::now();
        let offer = offer.clone();
        let Peer {
            reader,
            mut writer,
            receiver,
        } = peer;
        let act = tokio::spawn(async move {
            for i in 0..60usize {
                let r = match attack {
                    "keepalives" => writer.send(&Message::Keepalive).await,
                    "trickle" => writer.send_raw(&offer[i % offer.len()..][..1]).await,
                    "busy without work" => writer.send(&Message::Busy(pb::Busy { work: 7 })).await,
                    _ => {
                        let work = 1000 * (i as u64 + 1);
                        writer.send(&Message::Busy(pb::Busy { work })).await
                    }
                };
                if r.is_err() || writer.flush().await.is_err() {
                    return;
                }
                // The attack's pace (a frame well inside the idle timeout), not synchronization.
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        });
        let drain = tokio::spawn(async move {
            let mut reader = reader;
            while let Ok(Some(_)) = reader.next().await {}
        });
        let err = tokio::time::timeout(Duration::from_secs(20), receiver)
            .await
            .unwrap_or_else(|_| panic!("{attack}: the session was held for 20 s"))
            .unwrap()
            .expect_err("the session must fail");
        let took = started.elapsed();
        act.abort();
        drain.abort();
        assert!(err.contains("no progress"), "{attack}: {err}");
        assert!(
            took < Duration::from_secs(8),
            "{attack}: cut off after {took:?}"
        );
    }
}

/// A receiver that answers the handshake and then only sends keepalives (so no idle timeout
/// trips) cannot hold a sender: it fails at its progress deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalling_receiver_cannot_hold_the_sender() {
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("a.txt"), b"hello");
    let (client, server) = tokio::io::duplex(1 << 20);
    let fake = tokio::spawn(async move {
        let (r, w) = tokio::io::split(server);
        let mut reader = FrameReader::new(r, 0, Duration::from_secs(30), Default::default());
        let mut writer = FrameWriter::new(w, 0, Duration::from_secs(30), Default::default());
        if welcome(&mut reader, &mut writer, caps::SUPPORTED)
            .await
            .is_none()
        {
            return;
        }
        let drain = tokio::spawn(async move { while let Ok(Some(_)) = reader.next().await {} });
        loop {
            if writer.send(&Message::Keepalive).await.is_err() || writer.flush().await.is_err() {
                break;
            }
            // The stalling receiver's pace (keepalives inside the idle timeout), not
            // synchronization.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        drain.abort();
    });
    let started = std::time::Instant::now();
    let err = send_failing(src.path(), "stall", Default::default(), client).await;
    fake.abort();
    assert!(err.contains("no progress"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A sender that scatters its blocks (every other block of a huge declared file, each an
/// all-zero frame of a few bytes) is refused before the receiver's bookkeeping grows with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scattered_blocks_are_refused_before_they_cost_memory() {
    let dst = tempfile::tempdir().unwrap();
    let mut peer = connect(dst.path(), "scatter", caps::SUPPORTED).await;
    let size = 20_000 * BLOCK_SIZE as u64;
    let want = peer
        .offer(pb::Entry {
            path: "huge".into(),
            kind: pb::EntryKind::File as i32,
            mode: 0o644,
            size,
            ..Default::default()
        })
        .await;
    let zero_hash = blake3::hash(&vec![0u8; BLOCK_SIZE]).as_bytes().to_vec();
    for k in 0..6000u64 {
        let m = Message::Block {
            header: pb::BlockHeader {
                file_id: want.file_id,
                index: 2 * k,
                raw_len: BLOCK_SIZE as u32,
                codec: 3,
                hash: zero_hash.clone(),
            },
            data: Bytes::new(),
        };
        if peer.writer.send(&m).await.is_err() {
            break;
        }
    }
    let _ = peer.writer.flush().await;
    let err = peer.disconnect().await;
    assert!(err.contains("too scattered"), "{err}");
}

/// A receiver that skips every offered file and then, with the refetch capability, asks for
/// `refetch` after the sender's Done. Returns the sender's error and whether any Block came.
async fn hostile_refetch(src: &Path, refetch: pb::Refetch) -> (String, bool) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let fake = tokio::spawn(async move {
        let (r, w) = tokio::io::split(server);
        let mut reader = FrameReader::new(r, 0, Duration::from_secs(30), Default::default());
        let mut writer = FrameWriter::new(w, 0, Duration::from_secs(30), Default::default());
        let h = welcome(&mut reader, &mut writer, caps::SUPPORTED | caps::REFETCH)
            .await
            .expect("Hello");
        assert_ne!(h.capabilities & caps::REFETCH, 0, "senders ask for refetch");
        loop {
            match reader.expect().await.unwrap() {
                Message::Offer(o) => {
                    let skip = pb::EntryWant {
                        skip: true,
                        ..Default::default()
                    };
                    let want = pb::Want {
                        offer_id: o.offer_id,
                        entries: vec![skip; o.entries.len()],
                    };
                    writer.send(&Message::Want(want)).await.unwrap();
                    writer.flush().await.unwrap();
                }
                Message::Done(_) => break,
                _ => {}
            }
        }
        writer.send(&Message::Refetch(refetch)).await.unwrap();
        writer.flush().await.unwrap();
        let mut blocks = false;
        while let Ok(Some(m)) = reader.next().await {
            blocks |= matches!(m, Message::Block { .. });
        }
        blocks
    });
    let filter = ferry_mover::tree::Filter::new([(false, "*.key")]).unwrap();
    let err = send_failing(src, "refetch", Arc::new(filter), client).await;
    (err, fake.await.unwrap())
}

/// A fake receiver's handshake: reads the Hello and answers a Welcome granting what it asked
/// of `grant`. None when no Hello came.
async fn welcome(
    reader: &mut FrameReader<ReadHalf<DuplexStream>>,
    writer: &mut FrameWriter<WriteHalf<DuplexStream>>,
    grant: u64,
) -> Option<pb::Hello> {
    let Ok(Message::Hello(h)) = reader.expect().await else {
        return None;
    };
    let welcome = pb::Welcome {
        version: h.version,
        capabilities: h.capabilities & grant,
        session_id: h.session_id.clone(),
        stream_index: h.stream_index,
        block_size: h.block_size,
        dedup_nonce: Vec::new(),
    };
    writer.send(&Message::Welcome(welcome)).await.ok()?;
    writer.flush().await.ok()?;
    Some(h)
}

/// Sends `src` to the fake receiver at the other end of `client` (short progress timeouts), and
/// returns the error it must fail with within 20 s.
async fn send_failing(
    src: &Path,
    transfer_id: &str,
    filter: Arc<ferry_mover::tree::Filter>,
    client: DuplexStream,
) -> String {
    let cfg = ferry_mover::session::SenderConfig {
        root: src.to_owned(),
        transfer_id: transfer_id.into(),
        compress: ferry_mover::session::Compress::None,
        delete: false,
        checksum: false,
        sync: false,
        bandwidth_limit: None,
        timeouts: stall_timeouts(),
        filter,
        dry_run: false,
        on_unreadable: Default::default(),
        shutdown: ferry_mover::session::Shutdown::never(),
        shared: None,
        source_file: None,
    };
    let progress = Arc::new(Progress::new(transfer_id, "sender"));
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        ferry_mover::session::send_session(&cfg, vec![client], progress),
    )
    .await
    .expect("the sender was held for 20 s");
    error_chain(&r.expect_err("the send must fail"))
}

/// A receiver can ask again only for full blocks, as announced, of files the transfer sends:
/// not for a file the filter leaves out, a path outside the tree, a block past the end or
/// content the source does not hold. The sender sends nothing for such a Refetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_cannot_refetch_what_the_transfer_does_not_send() {
    let src = tempfile::tempdir().unwrap();
    let model = random_bytes(BLOCK_SIZE + 10, 7);
    write(&src.path().join("model.bin"), &model);
    write(&src.path().join("tls.key"), &random_bytes(BLOCK_SIZE, 8));
    let real = blake3::hash(&model[..BLOCK_SIZE]).as_bytes().to_vec();
    let ask = |path: &str, index: u64, hash: &[u8]| pb::Refetch {
        file_id: 1,
        path: path.as_bytes().to_vec(),
        indexes: vec![index],
        hashes: vec![hash.to_vec()],
        pack: None,
    };
    let key_hash = blake3::hash(&std::fs::read(src.path().join("tls.key")).unwrap());
    for (what, refetch, expected) in [
        (
            "an excluded file",
            ask("tls.key", 0, key_hash.as_bytes()),
            "not one this transfer sends",
        ),
        (
            "a path outside the tree",
            ask("../x", 0, &real),
            "refused a Refetch",
        ),
        (
            "a wrong hash",
            ask("model.bin", 0, &[9u8; 32]),
            "no longer holds",
        ),
        (
            "the partial last block",
            ask("model.bin", 1, &real),
            "no longer holds",
        ),
    ] {
        let (err, blocks) = hostile_refetch(src.path(), refetch).await;
        assert!(err.contains(expected), "{what}: {err}");
        assert!(!blocks, "{what}: the sender sent a block");
    }
}
