//! The end-to-end transfer digest (docs/protocol.md, "Transfer digest"): both ends compute it
//! independently and agree; it follows every change of content, mode, mtime or name; an
//! unchanged rerun reproduces it; a destination that differs from the source while looking
//! unchanged (same size and mtime) makes the sender fail naming both digests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;
use ferry_mover::session::Compress;

/// Flips one byte at `offset`, keeping the size and the mtime (so size+mtime says "unchanged").
fn poke(path: &Path, offset: usize) {
    let md = std::fs::metadata(path).unwrap();
    let mut data = std::fs::read(path).unwrap();
    data[offset] ^= 0x5a;
    std::fs::write(path, &data).unwrap();
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(md.modified().unwrap())
        .unwrap();
}

fn agreed(
    s: &ferry_mover::session::SessionSummary,
    r: &ferry_mover::session::SessionSummary,
) -> String {
    assert_eq!(s.digest.len(), 64, "sender digest {:?}", s.digest);
    assert_eq!(s.digest, r.digest, "sender and receiver digests");
    s.digest.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_ends_agree_and_the_digest_follows_every_change() {
    let pki = pki("digest-1");
    let src = tempfile::tempdir().unwrap();
    let src = src.path();
    mixed_tree(src);
    let dst = tempfile::tempdir().unwrap();
    let dst = dst.path();
    let o = SendOpts::default();

    let (s, r) = round_trip(&pki, src, dst, &o).await;
    let base = agreed(&s, &r);
    assert_same_tree(src, dst);

    // Unchanged: everything is skipped, both ends read the unchanged files, same digest.
    let (s, r) = round_trip(&pki, src, dst, &o).await;
    assert_eq!(r.files, 0, "nothing rewritten");
    assert_eq!(agreed(&s, &r), base, "unchanged rerun");
    // Another destination, other streams and codec, and --checksum: same digest.
    let other = tempfile::tempdir().unwrap();
    let one_stream = SendOpts {
        streams: 1,
        compress: Compress::Zstd,
        ..Default::default()
    };
    let (s, r) = round_trip(&pki, src, other.path(), &one_stream).await;
    assert_eq!(agreed(&s, &r), base, "fresh destination");
    let checksum = SendOpts {
        checksum: true,
        ..Default::default()
    };
    let (s, r) = round_trip(&pki, src, dst, &checksum).await;
    assert_eq!(agreed(&s, &r), base, "--checksum");

    let mut seen = vec![base.clone()];
    let mut fresh = |s: String| {
        assert!(!seen.contains(&s), "digest {s} seen before");
        seen.push(s.clone());
        s
    };

    // One byte of a small file, same size and mtime.
    poke(&src.join("many/f0007"), 3);
    let d = tempfile::tempdir().unwrap();
    let (s, r) = round_trip(&pki, src, d.path(), &o).await;
    let byte = fresh(agreed(&s, &r));
    // The old destination holds the old byte with the same size and mtime, so the receiver
    // skips the file and its digest describes what it holds: the sender fails, naming both.
    let (addr, recv) = start_receiver(&pki, dst).await;
    let progress = std::sync::Arc::new(ferry_mover::progress::Progress::new(
        &pki.transfer,
        "sender",
    ));
    let err = send_watched(&pki, src, addr, &o, progress.clone())
        .await
        .unwrap_err();
    let r = recv.await.unwrap().expect("the receiver finished its side");
    assert_eq!(r.digest, base, "receiver's digest over what it holds");
    assert!(err.contains("transfer digests differ"), "{err}");
    assert!(err.contains(&byte) && err.contains(&base), "{err}");
    // The operator sees the failure, where it lies, and the sender's digest.
    let p = progress.snapshot();
    assert_eq!(p.phase, ferry_mover::progress::Phase::Failed);
    assert_eq!(
        p.error_kind,
        Some(ferry_mover::kind::ErrorKind::Destination)
    );
    assert!(
        p.last_error.contains("transfer digests differ"),
        "{}",
        p.last_error
    );
    assert_eq!(p.digest, byte);
    // --checksum compares contents and resends the file.
    let (s, r) = round_trip(&pki, src, dst, &checksum).await;
    assert_eq!(r.files, 1);
    assert_eq!(agreed(&s, &r), byte);
    assert_same_tree(src, dst);

    // One byte in the third block of a large file.
    poke(&src.join("big.bin"), 9 * 1024 * 1024 + 1);
    let (s, r) = round_trip(&pki, src, dst, &checksum).await;
    assert_eq!(r.files, 1);
    fresh(agreed(&s, &r));

    // One mode: size and mtime unchanged, the receiver applies the mode to its file.
    std::fs::set_permissions(
        src.join("dir/mid.bin"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let (s, r) = round_trip(&pki, src, dst, &o).await;
    assert_eq!(r.files, 0, "content unchanged");
    fresh(agreed(&s, &r));
    assert_same_tree(src, dst);

    // One mtime.
    std::fs::File::options()
        .write(true)
        .open(src.join("dir/sub/deep.txt"))
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000))
        .unwrap();
    let (s, r) = round_trip(&pki, src, dst, &o).await;
    fresh(agreed(&s, &r));
    assert_same_tree(src, dst);

    // One name (without --delete the old name stays at the destination, outside the digest).
    std::fs::rename(src.join("many/f0001"), src.join("many/g0001")).unwrap();
    let (s, r) = round_trip(&pki, src, dst, &o).await;
    let renamed = fresh(agreed(&s, &r));
    assert!(dst.join("many/f0001").exists());

    // A directory's mode, then back: the earlier digest again.
    let dir_mode = std::fs::metadata(src.join("empty-dir")).unwrap().mode() & 0o777;
    std::fs::set_permissions(
        src.join("empty-dir"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let (s, r) = round_trip(&pki, src, dst, &o).await;
    fresh(agreed(&s, &r));
    std::fs::set_permissions(
        src.join("empty-dir"),
        std::fs::Permissions::from_mode(dir_mode),
    )
    .unwrap();
    let (s, r) = round_trip(&pki, src, dst, &o).await;
    assert_eq!(agreed(&s, &r), renamed, "same tree, same digest");

    // A symlink's target.
    std::fs::remove_file(src.join("link")).unwrap();
    std::os::unix::fs::symlink("dir/sub/other", src.join("link")).unwrap();
    let (s, r) = round_trip(&pki, src, dst, &o).await;
    fresh(agreed(&s, &r));
    assert_eq!(
        std::fs::read_link(dst.join("link")).unwrap(),
        Path::new("dir/sub/other")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_digest_does_not_depend_on_where_the_files_came_from() {
    // Hard links, resumed nothing, a tree with many directories: the same source gives the same
    // digest through 1 and 4 streams and with --delete into a destination full of extras.
    let pki = pki("digest-2");
    let src = tempfile::tempdir().unwrap();
    for d in 0..30 {
        for f in 0..20 {
            write(
                &src.path().join(format!("d{d:02}/e{}/f{f}", d % 3)),
                format!("{d} {f}\n").repeat(d * f + 1).as_bytes(),
            );
        }
        std::fs::hard_link(
            src.path().join(format!("d{d:02}/e{}/f0", d % 3)),
            src.path().join(format!("d{d:02}/link")),
        )
        .unwrap();
    }
    let a = tempfile::tempdir().unwrap();
    let (s, r) = round_trip(&pki, src.path(), a.path(), &SendOpts::default()).await;
    let base = agreed(&s, &r);
    let b = tempfile::tempdir().unwrap();
    write(&b.path().join("d03/extra"), b"not in the source");
    write(&b.path().join("zz/extra"), b"not in the source");
    let o = SendOpts {
        streams: 4,
        delete: true,
        ..Default::default()
    };
    let (s, r) = round_trip(&pki, src.path(), b.path(), &o).await;
    assert_eq!(agreed(&s, &r), base);
    assert!(r.deleted >= 2);
    assert_same_tree(src.path(), b.path());
}

use std::os::unix::fs::MetadataExt;
