//! Sparse files keep their holes (allocated blocks and SEEK_HOLE), and their contents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use copy_support::*;

#[test]
fn holes_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    std::fs::create_dir_all(&src).unwrap();
    let size: u64 = 64 << 20;
    {
        let mut f = std::fs::File::create(src.join("sparse")).unwrap();
        f.set_len(size).unwrap();
        f.seek(SeekFrom::Start(8 << 20)).unwrap();
        f.write_all(&[0xab; 128 * 1024]).unwrap();
        f.seek(SeekFrom::Start(40 << 20)).unwrap();
        f.write_all(&[0xcd; 4096]).unwrap();
    }
    let src_md = std::fs::metadata(src.join("sparse")).unwrap();
    assert!(
        src_md.blocks() * 512 < size / 8,
        "test filesystem does not keep holes"
    );

    copy_ok(&src, &dst, &[]);
    assert_same_tree(&src, &dst);
    let md = std::fs::metadata(dst.join("sparse")).unwrap();
    assert_eq!(md.len(), size);
    assert!(
        md.blocks() * 512 <= src_md.blocks() * 512 + (1 << 20),
        "holes filled: {} blocks",
        md.blocks()
    );
    let f = std::fs::File::open(dst.join("sparse")).unwrap();
    let hole = rustix::fs::seek(f.as_fd(), rustix::fs::SeekFrom::Hole(0)).unwrap();
    assert_eq!(hole, 0, "file must start with a hole");
    let data = rustix::fs::seek(f.as_fd(), rustix::fs::SeekFrom::Data(0)).unwrap();
    assert!(
        ((8 << 20) - 4096..=8 << 20).contains(&data),
        "first data at {data}"
    );
}
