//! Feeds arbitrary need sets (a Want's `need_blocks` bitmap and `need_ranges` pairs, for a file
//! of any block count) to the one parser both ends use. Must never panic; the set's size must
//! follow what was sent, never the declared file size; and what it encodes parses back the same.
#![no_main]

use ferry_mover::wire::BlockSet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&data[..8]);
    let nblocks = u64::from_le_bytes(n);
    let split = usize::from(data[8]).min(data.len() - 9);
    let (bitmap, rest) = data[9..].split_at(split);
    let pairs: Vec<u64> = rest
        .chunks_exact(8)
        .map(|c| {
            let mut v = [0u8; 8];
            v.copy_from_slice(c);
            u64::from_le_bytes(v)
        })
        .collect();
    if let Ok(set) = BlockSet::from_want(bitmap, &pairs, nblocks) {
        assert!(set.range_count() <= pairs.len() / 2 + bitmap.len() * 4 + 1);
        assert!(set.len() <= nblocks);
        let (b, r) = set.to_want(nblocks);
        assert_eq!(BlockSet::from_want(&b, &r, nblocks).ok(), Some(set));
    }
});
