//! A scripted malicious sender speaking the codec directly after a valid handshake. Oracle for
//! every case: the receiver ends with a clear error, nothing appears outside its root, and no
//! final path holds bytes that were not verified.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use common::*;
use ferry_mover::progress::Progress;
use ferry_mover::session::{
    FrameReader, FrameWriter, ReceiverConfig, accept_stream, receive_session,
};
use ferry_mover::wire::{self, BLOCK_SIZE, FrameType, Message, caps, codec};
use ferry_proto::wire::v1 as pb;

struct World {
    _base: tempfile::TempDir,
    root: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn world() -> World {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("root");
    let outside = base.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    write(&outside.join("sentinel"), b"keep me");
    World {
        root,
        outside,
        _base: base,
    }
}

impl World {
    /// Nothing new next to or above the root: only `root` and `outside/sentinel` exist.
    fn assert_outside_untouched(&self) {
        let base = self.root.parent().unwrap();
        let mut names: Vec<_> = std::fs::read_dir(base)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["outside", "root"]);
        let inside: Vec<_> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(inside.len(), 1, "new entries outside the root: {inside:?}");
        assert_eq!(
            std::fs::read(self.outside.join("sentinel")).unwrap(),
            b"keep me"
        );
    }
}

fn hello(caps: u64) -> pb::Hello {
    pb::Hello {
        version: wire::PROTOCOL_VERSION,
        capabilities: caps,
        transfer_id: "evil".into(),
        session_id: vec![9; 16],
        stream_index: 0,
        stream_count: 1,
        block_size: BLOCK_SIZE as u32,
        filter_rules: Vec::new(),
    }
}

fn encode(msgs: &[Message]) -> Vec<u8> {
    let mut b = BytesMut::new();
    for m in msgs {
        m.encode(&mut b).unwrap();
    }
    b.to_vec()
}

/// Runs a receiver on one in-memory stream, feeds it `script` (raw bytes after Hello), then
/// closes; returns the receiver's error text (or "OK").
async fn run_script(root: &Path, negotiated: u64, script: Vec<u8>) -> String {
    run_script_keeping(root, negotiated, script, Default::default()).await
}

/// The same against a receiver that keeps what `keep` says (`--xattrs`, ...).
async fn run_script_keeping(
    root: &Path,
    negotiated: u64,
    script: Vec<u8>,
    keep: ferry_mover::session::Keep,
) -> String {
    let (client, server) = tokio::io::duplex(32 * 1024 * 1024);
    let cfg = ReceiverConfig {
        root: root.to_owned(),
        transfer_id: "evil".into(),
        timeouts: fast_timeouts(),
        sync: false,
        cas: None,
        block_service: None,
        swarm: None,
        identity: None,
        keep,
        shutdown: ferry_mover::session::Shutdown::never(),
    };
    let recv = tokio::spawn(async move {
        let progress = Arc::new(Progress::new("evil", "receiver"));
        let acc = accept_stream(server, &cfg, progress.wire_bytes.clone(), 0)
            .await
            .map_err(|e| ferry_mover::session::error_chain(&e))?;
        receive_session(&cfg, vec![acc], progress)
            .await
            .map_err(|e| ferry_mover::session::error_chain(&e))
    });
    let (r, w) = tokio::io::split(client);
    let mut reader = FrameReader::new(r, 0, std::time::Duration::from_secs(5), Default::default());
    let mut writer = FrameWriter::new(w, 0, std::time::Duration::from_secs(5), Default::default());
    writer
        .send(&Message::Hello(hello(negotiated)))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    match reader.expect().await.unwrap() {
        Message::Welcome(_) => {}
        other => panic!("expected Welcome, got {other:?}"),
    }
    let _ = writer.send_raw(&script).await;
    writer.shutdown().await;
    // Drain answers so the receiver never blocks on writing.
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = reader.next().await {} });
    let out = match recv.await.unwrap() {
        Ok(_) => "OK".to_owned(),
        Err(e) => e,
    };
    drain.abort();
    out
}

fn file(path: impl Into<Vec<u8>>, size: u64) -> pb::Entry {
    pb::Entry {
        path: path.into(),
        kind: pb::EntryKind::File as i32,
        mode: 0o644,
        size,
        ..Default::default()
    }
}

fn offer(id: u64, entries: Vec<pb::Entry>) -> Message {
    Message::Offer(pb::Offer {
        offer_id: id,
        entries,
    })
}

fn batch(file_id: u64, content: &[u8], codec_id: u32, stored: Vec<u8>) -> Message {
    Message::Batch {
        header: pb::BatchHeader {
            files: vec![pb::BatchFile {
                file_id,
                raw_len: content.len() as u32,
                stored_len: stored.len() as u32,
                codec: codec_id,
                hash: blake3::hash(content).as_bytes().to_vec(),
            }],
        },
        data: Bytes::from(stored),
    }
}

/// A complete, valid one-file session; the receiver assigns file id 1 to the first file.
fn valid_session() -> Vec<Message> {
    vec![
        offer(1, vec![file("ok.txt", 5)]),
        batch(1, b"hello", codec::RAW, b"hello".to_vec()),
        Message::Done(pb::Done::default()),
        Message::DirDone(pb::DirDone {
            dir: Some(pb::Entry {
                path: Vec::new(),
                kind: pb::EntryKind::Dir as i32,
                mode: 0o755,
                ..Default::default()
            }),
            complete_listing: false,
            names: vec![],
        }),
        Message::Finish,
    ]
}

#[tokio::test]
async fn valid_script_succeeds() {
    let w = world();
    let out = run_script(&w.root, caps::SUPPORTED, encode(&valid_session())).await;
    assert_eq!(out, "OK");
    assert_eq!(std::fs::read(w.root.join("ok.txt")).unwrap(), b"hello");
}

#[tokio::test]
async fn dot_dot_and_absolute_names_are_refused() {
    // Names travel as bytes; the rules hold for names that are not UTF-8 too.
    for bad in [
        &b"../escape"[..],
        b"a/../../escape",
        b"/tmp/ferry-abs-escape",
        b"a//b",
        b"./x",
        b"\xff/../../escape",
        b"/tmp/ferry-abs-escape-\xe9",
        b"caf\xe9\0.txt",
        b"\xe9//b",
        b".ferry-staging/\xe9",
        b"",
    ] {
        let w = world();
        let out = run_script(
            &w.root,
            caps::SUPPORTED,
            encode(&[offer(1, vec![file(bad, 1)])]),
        )
        .await;
        let shown = String::from_utf8_lossy(bad);
        assert!(out.contains("invalid path"), "{shown}: {out}");
        w.assert_outside_untouched();
        assert!(!Path::new("/tmp/ferry-abs-escape").exists());
    }
}

#[tokio::test]
async fn write_through_a_symlink_is_refused() {
    let w = world();
    let link = pb::Entry {
        path: "l".into(),
        kind: pb::EntryKind::Symlink as i32,
        target: w.outside.display().to_string().into(),
        ..Default::default()
    };
    let script = encode(&[
        offer(1, vec![link]),
        offer(2, vec![file("l/pwned", 5)]),
        batch(1, b"pwned", codec::RAW, b"pwned".to_vec()),
    ]);
    let out = run_script(&w.root, caps::SUPPORTED, script).await;
    assert!(out.contains("l"), "{out}");
    assert_ne!(out, "OK");
    w.assert_outside_untouched();
    // The engine replaces a symlink standing where a directory is needed (rsync semantics), so
    // whatever is at `l` now is the inert link or a real directory inside the root.
    let md = std::fs::symlink_metadata(w.root.join("l")).unwrap();
    assert!(md.file_type().is_symlink() || md.is_dir());

    // Relative escape through a symlinked parent directory and a dir entry below it.
    let w = world();
    let link = pb::Entry {
        path: "up".into(),
        kind: pb::EntryKind::Symlink as i32,
        target: "../outside".into(),
        ..Default::default()
    };
    let dir = pb::Entry {
        path: "up/newdir".into(),
        kind: pb::EntryKind::Dir as i32,
        ..Default::default()
    };
    let out = run_script(
        &w.root,
        caps::SUPPORTED,
        encode(&[offer(1, vec![link, dir])]),
    )
    .await;
    assert_ne!(out, "OK");
    w.assert_outside_untouched();

    // A hard link to a file outside the root through a symlink.
    let w = world();
    let link = pb::Entry {
        path: "up".into(),
        kind: pb::EntryKind::Symlink as i32,
        target: "../outside".into(),
        ..Default::default()
    };
    let hard = pb::Entry {
        path: "copy".into(),
        kind: pb::EntryKind::Hardlink as i32,
        target: "up/sentinel".into(),
        ..Default::default()
    };
    let out = run_script(
        &w.root,
        caps::SUPPORTED,
        encode(&[offer(1, vec![link, hard])]),
    )
    .await;
    assert_ne!(out, "OK");
    assert!(
        !w.root.join("copy").exists(),
        "hard link to an outside file created"
    );
    w.assert_outside_untouched();
}

#[tokio::test]
async fn duplicate_entries_are_refused() {
    let w = world();
    let out = run_script(
        &w.root,
        caps::SUPPORTED,
        encode(&[offer(1, vec![file("a", 3), file("a", 3)])]),
    )
    .await;
    assert!(out.contains("duplicate entry a"), "{out}");
    assert!(!w.root.join("a").exists());
}

#[tokio::test]
async fn four_gib_length_field_is_refused_before_allocation() {
    let w = world();
    let out = run_script(
        &w.root,
        caps::SUPPORTED,
        vec![0xff, 0xff, 0xff, 0xff, FrameType::Block as u8],
    )
    .await;
    assert!(out.contains("above its cap"), "{out}");
    let out = run_script(
        &w.root,
        caps::SUPPORTED,
        vec![0xff, 0xff, 0xff, 0xff, FrameType::Offer as u8],
    )
    .await;
    assert!(out.contains("above its cap"), "{out}");
}

#[tokio::test]
async fn unknown_and_reserved_frame_types_are_refused() {
    let w = world();
    let out = run_script(&w.root, caps::SUPPORTED, vec![0, 0, 0, 0, 0x7f]).await;
    assert!(out.contains("unknown frame type 0x7f"), "{out}");
    let out = run_script(&w.root, caps::SUPPORTED, vec![0, 0, 0, 0, 0x22]).await;
    assert!(out.contains("reserved for the block store"), "{out}");
    // Out of order: a second Hello, or Finish before Done.
    let out = run_script(
        &w.root,
        caps::SUPPORTED,
        encode(&[Message::Hello(hello(0))]),
    )
    .await;
    assert!(out.contains("not allowed"), "{out}");
    let out = run_script(&w.root, caps::SUPPORTED, encode(&[Message::Finish])).await;
    assert!(out.contains("not allowed"), "{out}");
}

#[tokio::test]
async fn every_truncation_of_a_valid_session_fails_cleanly() {
    let whole = encode(&valid_session());
    for cut in 0..whole.len() {
        let w = world();
        let out = run_script(&w.root, caps::SUPPORTED, whole[..cut].to_vec()).await;
        assert!(out.contains("closed by peer"), "cut {cut}: {out}");
        // A final path holds verified content or nothing.
        match std::fs::read(w.root.join("ok.txt")) {
            Ok(c) => assert_eq!(c, b"hello", "cut {cut}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
        }
        w.assert_outside_untouched();
    }
}

#[tokio::test]
async fn zstd_expanding_past_the_block_size_is_refused() {
    let w = world();
    // Small file declared 10 bytes, zstd payload that decodes to 1 MiB.
    let bomb = zstd::bulk::compress(&vec![0u8; 1024 * 1024], 3).unwrap();
    let script = encode(&[
        offer(1, vec![file("bomb", 10)]),
        batch(1, &[0u8; 10], codec::ZSTD, bomb),
    ]);
    let out = run_script(&w.root, caps::SUPPORTED, script).await;
    assert!(out.contains("does not decode to exactly 10 bytes"), "{out}");
    assert!(!w.root.join("bomb").exists());

    // Large file: block 1 is declared 1 byte and expands to a whole block (and more).
    let w = world();
    let bomb = zstd::bulk::compress(&vec![0u8; 2 * BLOCK_SIZE], 3).unwrap();
    let script = encode(&[
        offer(1, vec![file("big", BLOCK_SIZE as u64 + 1)]),
        Message::Block {
            header: pb::BlockHeader {
                file_id: 1,
                index: 1,
                raw_len: 1,
                codec: codec::ZSTD,
                hash: blake3::hash(&[0]).as_bytes().to_vec(),
            },
            data: Bytes::from(bomb),
        },
    ]);
    let out = run_script(&w.root, caps::SUPPORTED, script).await;
    assert!(out.contains("does not decode"), "{out}");
    assert!(!w.root.join("big").exists());

    // zstd when the session did not negotiate it.
    let w = world();
    let z = zstd::bulk::compress(b"hello", 3).unwrap();
    let script = encode(&[
        offer(1, vec![file("z", 5)]),
        batch(1, b"hello", codec::ZSTD, z),
    ]);
    let out = run_script(&w.root, caps::LZ4, script).await;
    assert!(out.contains("not negotiated"), "{out}");
}

#[tokio::test]
async fn block_that_does_not_match_its_hash_is_refused() {
    let w = world();
    let mut bad = batch(1, b"hello", codec::RAW, b"HELLO".to_vec());
    if let Message::Batch { header, .. } = &mut bad {
        header.files[0].hash = blake3::hash(b"hello").as_bytes().to_vec();
    }
    let out = run_script(
        &w.root,
        caps::SUPPORTED,
        encode(&[offer(1, vec![file("h", 5)]), bad]),
    )
    .await;
    assert!(out.contains("does not match its BLAKE3 hash"), "{out}");
    assert!(!w.root.join("h").exists());

    let w = world();
    let data = vec![7u8; BLOCK_SIZE];
    let script = encode(&[
        offer(1, vec![file("big", 2 * BLOCK_SIZE as u64)]),
        Message::Block {
            header: pb::BlockHeader {
                file_id: 1,
                index: 0,
                raw_len: BLOCK_SIZE as u32,
                codec: codec::RAW,
                hash: vec![0; 32],
            },
            data: Bytes::from(data),
        },
    ]);
    let out = run_script(&w.root, caps::SUPPORTED, script).await;
    assert!(out.contains("block 0 does not match"), "{out}");
    assert!(!w.root.join("big").exists());
}

#[tokio::test]
async fn blocks_out_of_range_or_twice_or_for_unknown_files_are_refused() {
    let block = |file_id, index, raw: &[u8]| Message::Block {
        header: pb::BlockHeader {
            file_id,
            index,
            raw_len: raw.len() as u32,
            codec: codec::RAW,
            hash: blake3::hash(raw).as_bytes().to_vec(),
        },
        data: Bytes::copy_from_slice(raw),
    };
    let size = BLOCK_SIZE as u64 + 3;
    let cases = [
        (vec![block(99, 0, b"abc")], "unknown file id 99"),
        (vec![block(1, 5, b"abc")], "past the last block"),
        (vec![block(1, 1, b"abcd")], "expected 3"),
        (vec![block(1, 1, b"abc"), block(1, 1, b"abc")], "sent twice"),
    ];
    for (blocks, want) in cases {
        let w = world();
        let mut msgs = vec![offer(1, vec![file("big", size)])];
        msgs.extend(blocks);
        msgs.push(Message::Done(pb::Done::default()));
        msgs.push(Message::Finish);
        let out = run_script(&w.root, caps::SUPPORTED, encode(&msgs)).await;
        assert!(out.contains(want), "want {want:?}: {out}");
        assert!(!w.root.join("big").exists());
    }
    // Finish with a file still incomplete.
    let w = world();
    let msgs = vec![
        offer(1, vec![file("big", size)]),
        block(1, 1, b"abc"),
        Message::Done(pb::Done::default()),
        Message::Finish,
    ];
    let out = run_script(&w.root, caps::SUPPORTED, encode(&msgs)).await;
    assert!(out.contains("incomplete"), "{out}");
    assert!(!w.root.join("big").exists());
}

#[tokio::test]
async fn batch_with_trailing_or_missing_bytes_is_refused() {
    let w = world();
    let mut m = batch(1, b"hello", codec::RAW, b"hello".to_vec());
    if let Message::Batch { data, .. } = &mut m {
        let mut d = BytesMut::from(&data[..]);
        d.put_slice(b"extra");
        *data = d.freeze();
    }
    let out = run_script(
        &w.root,
        caps::SUPPORTED,
        encode(&[offer(1, vec![file("t", 5)]), m]),
    )
    .await;
    assert!(out.contains("trailing bytes"), "{out}");
    let w = world();
    let mut m = batch(1, b"hello", codec::RAW, b"hel".to_vec());
    if let Message::Batch { header, .. } = &mut m {
        header.files[0].stored_len = 5;
    }
    let out = run_script(
        &w.root,
        caps::SUPPORTED,
        encode(&[offer(1, vec![file("t", 5)]), m]),
    )
    .await;
    assert!(out.contains("past the end"), "{out}");
    assert!(!w.root.join("t").exists());
}

/// Receiver with a 1 s idle timeout on a small pipe; the client handshakes, then runs `act`.
async fn run_stalling<F, Fut>(root: &Path, act: F) -> (String, std::time::Duration)
where
    F: FnOnce(
        FrameReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
        FrameWriter<tokio::io::WriteHalf<tokio::io::DuplexStream>>,
    ) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (client, server) = tokio::io::duplex(64 * 1024);
    let cfg = ReceiverConfig {
        root: root.to_owned(),
        transfer_id: "evil".into(),
        timeouts: ferry_mover::session::Timeouts {
            handshake: std::time::Duration::from_secs(2),
            idle: std::time::Duration::from_secs(1),
            progress: std::time::Duration::from_secs(30),
        },
        sync: false,
        cas: None,
        block_service: None,
        swarm: None,
        identity: None,
        keep: Default::default(),
        shutdown: ferry_mover::session::Shutdown::never(),
    };
    let started = std::time::Instant::now();
    let recv = tokio::spawn(async move {
        let progress = Arc::new(Progress::new("evil", "receiver"));
        let acc = accept_stream(server, &cfg, progress.wire_bytes.clone(), 0)
            .await
            .map_err(|e| ferry_mover::session::error_chain(&e))?;
        receive_session(&cfg, vec![acc], progress)
            .await
            .map_err(|e| ferry_mover::session::error_chain(&e))
    });
    let (r, w) = tokio::io::split(client);
    let mut reader = FrameReader::new(r, 0, std::time::Duration::from_secs(5), Default::default());
    let mut writer = FrameWriter::new(w, 0, std::time::Duration::from_secs(5), Default::default());
    writer
        .send(&Message::Hello(hello(caps::SUPPORTED)))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    assert!(matches!(
        reader.expect().await.unwrap(),
        Message::Welcome(_)
    ));
    let client = tokio::spawn(act(reader, writer));
    let out = tokio::time::timeout(std::time::Duration::from_secs(20), recv)
        .await
        .expect("receiver never gave up on a stalled peer")
        .unwrap();
    client.abort();
    (out.err().unwrap_or_else(|| "OK".into()), started.elapsed())
}

#[tokio::test]
async fn a_peer_that_stalls_after_the_handshake_times_out() {
    let w = world();
    let (out, took) = run_stalling(&w.root, |_r, w| async move {
        // Keep the connection open, say nothing.
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        drop(w);
    })
    .await;
    assert!(out.contains("idle timeout"), "{out}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
}

#[tokio::test]
async fn a_peer_that_floods_without_reading_is_cut_off() {
    let w = world();
    let (out, _) = run_stalling(&w.root, |_r, mut w| async move {
        // Endless offers, never reading a Want: the receiver's answers back up and its write
        // deadline cuts the peer off instead of buffering.
        for i in 0.. {
            let entries = (0..200).map(|j| file(format!("d{i}/f{j}"), 1)).collect();
            if w.send(&offer(i, entries)).await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(
        out.contains("write timeout") || out.contains("too many files"),
        "{out}"
    );
}

#[tokio::test]
async fn foreign_or_oversized_xattrs_are_refused_by_a_receiver_that_keeps_xattrs() {
    let with = |xattrs: Vec<(&[u8], Vec<u8>)>| {
        let mut e = file("f", 1);
        e.xattrs = xattrs
            .into_iter()
            .map(|(name, value)| pb::Xattr {
                name: name.to_vec(),
                value,
            })
            .collect();
        e
    };
    let keeping = ferry_mover::session::Keep {
        xattrs: true,
        ..Default::default()
    };
    let many: Vec<(&[u8], Vec<u8>)> = (0..5000).map(|_| (&b"user.a"[..], vec![1])).collect();
    for (e, why) in [
        (
            with(vec![(b"security.capability", vec![1])]),
            "is not a user.* name",
        ),
        (with(vec![(b"trusted.x", vec![1])]), "is not a user.* name"),
        (with(vec![(b"user.a\0b", vec![1])]), "is not a user.* name"),
        (with(vec![(b"user.", vec![1])]), "is not a user.* name"),
        (with(many), "extended attributes (at most 128)"),
        (
            with(vec![(b"user.big", vec![0; 70 * 1024])]),
            "bytes of extended attributes",
        ),
    ] {
        let w = world();
        let out = run_script_keeping(
            &w.root,
            caps::SUPPORTED,
            encode(&[offer(1, vec![e])]),
            keeping,
        )
        .await;
        // A protocol error of the peer's, not a destination fault or a full disk.
        assert!(out.contains(why), "{why}: {out}");
        assert!(!out.contains("No space left"), "{out}");
        assert!(!w.root.join("f").exists());
    }
}

#[tokio::test]
async fn without_xattrs_a_receiver_ignores_whatever_attributes_arrive() {
    let mut e = file("f", 1);
    e.xattrs = vec![pb::Xattr {
        name: b"security.capability".to_vec(),
        value: vec![1],
    }];
    let w = world();
    let out = run_script(&w.root, caps::SUPPORTED, encode(&[offer(1, vec![e])])).await;
    assert!(
        !out.contains("user.* name"),
        "the session failed on ignored xattrs: {out}"
    );
}

#[tokio::test]
async fn packs_outside_a_fan_out_are_refused() {
    // A receiver that is no fan-out destination grants no packs: a PackAnnounce or a Pack frame
    // is out of protocol, whatever it names, and nothing is written.
    let w = world();
    let announce = Message::PackAnnounce(pb::PackAnnounce {
        file_ids: vec![1],
        hash: vec![0; 32],
        proof: vec![0; 32],
    });
    let pack = Message::Pack {
        header: pb::PackHeader {
            pack_id: 1,
            raw_len: 5,
            codec: codec::RAW,
            hash: blake3::hash(b"hello").as_bytes().to_vec(),
        },
        data: Bytes::from_static(b"hello"),
    };
    for frame in [announce, pack] {
        let script = encode(&[offer(1, vec![file("ok.txt", 5)]), frame]);
        let out = run_script(&w.root, caps::SUPPORTED | caps::PACKS, script).await;
        assert!(out.contains("without the capability"), "{out}");
        assert!(!w.root.join("ok.txt").exists());
    }
    w.assert_outside_untouched();
}
