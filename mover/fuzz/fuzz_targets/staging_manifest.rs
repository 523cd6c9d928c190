//! Reads back a staging manifest and part file as a resuming receiver finds them on disk, with
//! arbitrary records (a hostile session of the same transfer, or edits on disk) and an
//! arbitrary declared size. Must never panic; what the manifest claims stays within the file's
//! blocks, names only non-zero records and fits a Want; a claimed block is kept only when the
//! part file's bytes hash to the sender's hash; the content hash needs every record.
#![no_main]

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use ferry_mover::session::staging::{StagingDir, block_count, block_len};
use ferry_mover::tree::Replace;
use ferry_mover::tree::peer_dest::PeerDest;
use ferry_mover::tree::peer_path::PeerPath;
use ferry_mover::wire::MAX_WANT_RANGES;
use libfuzzer_sys::fuzz_target;

const MTIME: (i64, u32) = (1_700_000_000, 7);
const RECORD: usize = 32;
/// Declared sizes stay below this many blocks' worth, so a case re-reads little.
const MAX_BLOCKS: u64 = 64;

struct Bed {
    staging: StagingDir,
    dir: PathBuf,
}

fn bed() -> &'static Bed {
    static BED: OnceLock<Bed> = OnceLock::new();
    BED.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("ferry-fuzz-staging-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let dest = PeerDest::open(&root, Replace::AnyDir, false).unwrap();
        let staging = StagingDir::open(&dest, "fuzz").unwrap();
        Bed {
            staging,
            dir: root.join(".ferry-staging").join("fuzz"),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    // [0..8) size, [8] flags, [9..11) part length, then the part file's bytes and the records.
    if data.len() < 11 {
        return;
    }
    let bed = bed();
    let size = u64::from_le_bytes(data[..8].try_into().unwrap())
        % (MAX_BLOCKS * ferry_mover::wire::BLOCK_SIZE as u64 + 1);
    let flags = data[8];
    let part_len = (u16::from_le_bytes([data[9], data[10]]) as usize).min(data.len() - 11);
    let (part, records) = data[11..].split_at(part_len);
    let path = PeerPath::parse(b"d/large.bin").unwrap();
    let nblocks = block_count(size);

    // A first session leaves a fresh manifest (its header) and part file behind ...
    let fresh = bed.staging.open_large(&path, size, MTIME, false).unwrap();
    let key = blake3::hash(path.as_bytes()).to_hex();
    let manifest_path = bed.dir.join(format!("{}.manifest", &key.as_str()[..32]));
    let base = std::fs::metadata(&manifest_path).unwrap().len();
    drop(fresh);
    // ... then its records and part bytes are replaced by the input. With flag bit 0, record
    // 0 is the true hash of block 0's bytes, so the path that keeps a block is reached too.
    let mut records = records.to_vec();
    if flags & 1 == 1 && size > 0 && part.len() as u64 >= block_len(size, 0) {
        let hash = blake3::hash(&part[..block_len(size, 0) as usize]);
        records.resize(records.len().max(RECORD), 0);
        records[..RECORD].copy_from_slice(hash.as_bytes());
    }
    let manifest = std::fs::OpenOptions::new()
        .write(true)
        .open(&manifest_path)
        .unwrap();
    manifest.set_len(base).unwrap();
    manifest.write_all_at(&records, base).unwrap();
    drop(manifest);
    let part_path = bed.dir.join(format!("{}.part", &key.as_str()[..32]));
    std::fs::write(&part_path, part).unwrap();

    let opened = bed.staging.open_large(&path, size, MTIME, true).unwrap();
    let record = |i: u64| -> Option<&[u8]> {
        let at = usize::try_from(i).ok()?.checked_mul(RECORD)?;
        records.get(at..at + RECORD)
    };
    if part.len() as u64 > size {
        assert!(
            opened.held.is_empty(),
            "a part file longer than the file was resumed"
        );
        assert!(!opened.staging.reused);
    }
    assert!(
        opened.held.range_count() <= MAX_WANT_RANGES,
        "the held blocks do not fit a Want"
    );
    let held: Vec<u64> = opened.held.iter().collect();
    for &i in &held {
        assert!(i < nblocks, "block {i} claimed of a {nblocks}-block file");
        let r = record(i).expect("a claimed block has a record");
        assert!(
            r.iter().any(|b| *b != 0),
            "block {i} claimed with an all-zero record"
        );
    }

    // The sender's hash of each claimed block is its record here: kept only when the bytes
    // in the part file hash to it.
    let hashes: Vec<[u8; 32]> = held
        .iter()
        .map(|&i| record(i).unwrap().try_into().unwrap())
        .collect();
    let must_come = opened.staging.verify_held(size, &held, &hashes);
    for ((&i, theirs), again) in held.iter().zip(&hashes).zip(&must_come) {
        let off = (i * ferry_mover::wire::BLOCK_SIZE as u64) as usize;
        let len = block_len(size, i) as usize;
        let ours = part
            .get(off..off + len)
            .map(|b| *blake3::hash(b).as_bytes());
        assert_eq!(
            !again,
            ours.as_ref() == Some(theirs),
            "block {i} kept wrongly"
        );
    }

    // A session that did not resume starts with no records at all.
    let complete = (0..nblocks)
        .all(|i| opened.staging.reused && record(i).is_some_and(|r| r.iter().any(|b| *b != 0)));
    let content = opened.staging.content_hash(nblocks, "d/large.bin");
    assert_eq!(
        content.is_ok(),
        complete,
        "a content hash needs every record, and only that"
    );
});
