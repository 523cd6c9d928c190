//! A file whose need bitmap would not fit a 64 KiB Want (more than 2 TiB) transfers: a sparse
//! file of 2 TiB + 4 MiB + 5 bytes apparent size, a little data at both ends, holes between
//! (read as holes, sent as zero blocks).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::FileExt;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sparse_file_over_two_tib_transfers() {
    let pki = pki("huge");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let size = (2u64 << 40) + 4 * 1024 * 1024 + 5;
    let path = src.path().join("huge.bin");
    let f = std::fs::File::create(&path).unwrap();
    if let Err(e) = f.set_len(size) {
        panic!(
            "this filesystem cannot hold a {size}-byte sparse file, so the test cannot run: {e}"
        );
    }
    let head = random_bytes(5 * 1024 * 1024, 1);
    let tail = random_bytes(3 * 1024 * 1024, 2);
    f.write_all_at(&head, 0).unwrap();
    f.write_all_at(&tail, size - tail.len() as u64).unwrap();
    drop(f);

    let started = std::time::Instant::now();
    let opts = SendOpts {
        streams: 2,
        compress: ferry_mover::session::Compress::None,
        ..Default::default()
    };
    let (sent, received) = round_trip(&pki, src.path(), dst.path(), &opts).await;
    eprintln!("2 TiB sparse file sent in {:?}", started.elapsed());
    assert_eq!(sent.digest, received.digest);
    let out = std::fs::File::open(dst.path().join("huge.bin")).unwrap();
    assert_eq!(out.metadata().unwrap().len(), size);
    let mut back = vec![0u8; head.len()];
    out.read_exact_at(&mut back, 0).unwrap();
    assert!(back == head);
    let mut back = vec![0u8; tail.len()];
    out.read_exact_at(&mut back, size - tail.len() as u64)
        .unwrap();
    assert!(back == tail);
    let mut middle = vec![1u8; 4096];
    out.read_exact_at(&mut middle, 1 << 40).unwrap();
    assert!(middle.iter().all(|b| *b == 0));
}
