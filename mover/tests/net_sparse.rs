//! A sparse file keeps its holes over the network at page granularity, as local `copy` keeps
//! them: the receiver leaves every all-zero 4 KiB page of a block unwritten.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use common::*;

const SIZE: u64 = 64 << 20;
/// Three 4 KiB extents: inside the first block, across no boundary in the middle, near the end.
const EXTENTS: [u64; 3] = [100 << 10, (20 << 20) + (12 << 10), SIZE - (64 << 10)];

fn sparse_file(path: &Path) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(SIZE).unwrap();
    for (i, off) in EXTENTS.iter().enumerate() {
        f.write_all_at(&random_bytes(4096, i as u64 + 1), *off)
            .unwrap();
    }
    let allocated = f.metadata().unwrap().blocks() * 512;
    assert!(
        allocated <= 64 << 10,
        "the test filesystem does not keep holes ({allocated} bytes allocated)"
    );
}

fn assert_sparse_copy(src: &Path, dst: &Path) {
    let md = std::fs::metadata(dst).unwrap();
    assert_eq!(md.len(), SIZE);
    let allocated = md.blocks() * 512;
    assert!(
        allocated <= 256 << 10,
        "holes filled at the destination: {allocated} bytes allocated"
    );
    let (a, b) = (std::fs::read(src).unwrap(), std::fs::read(dst).unwrap());
    assert!(a == b, "content differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_file_keeps_page_sized_holes_over_the_network() {
    let pki = pki("sparse-1");
    let src = tempfile::tempdir().unwrap();
    sparse_file(&src.path().join("sparse.img"));
    for compress in [
        ferry_mover::session::Compress::None,
        ferry_mover::session::Compress::Zstd,
    ] {
        let dst = tempfile::tempdir().unwrap();
        let o = SendOpts {
            compress,
            ..Default::default()
        };
        round_trip(&pki, src.path(), dst.path(), &o).await;
        assert_sparse_copy(
            &src.path().join("sparse.img"),
            &dst.path().join("sparse.img"),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_file_from_the_block_store_keeps_its_holes() {
    let pki = pki("sparse-2");
    let src = tempfile::tempdir().unwrap();
    sparse_file(&src.path().join("sparse.img"));
    let store_dir = tempfile::tempdir().unwrap();
    let store =
        std::sync::Arc::new(ferry_mover::cas::CasStore::open(store_dir.path(), 1 << 30).unwrap());
    // The first transfer fills the store, the second takes the blocks from it.
    for run in 0..2 {
        let dst = tempfile::tempdir().unwrap();
        let (addr, recv) = start_receiver_with_store(&pki, dst.path(), Some(store.clone())).await;
        send(&pki, src.path(), addr, &SendOpts::default())
            .await
            .expect("send");
        let got = recv.await.unwrap().expect("receive");
        if run == 1 {
            assert!(
                got.dedup_blocks >= 3,
                "blocks not taken from the store: {got:?}"
            );
        }
        assert_sparse_copy(
            &src.path().join("sparse.img"),
            &dst.path().join("sparse.img"),
        );
    }
}
