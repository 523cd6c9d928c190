//! Block geometry and the sets of block indexes the protocol carries (`need_blocks` bitmaps,
//! `need_ranges`), in one place for both ends.
//!
//! A [`BlockSet`] is a sorted set of disjoint index ranges, so its memory grows with how
//! fragmented it is, never with the size a peer declares: a 16 EiB file that is wholly needed is
//! one range.

use std::collections::BTreeMap;

use super::BLOCK_SIZE;

/// Blocks of a file of `size` bytes (block i covers `[i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE)`).
pub fn block_count(size: u64) -> u64 {
    size.div_ceil(BLOCK_SIZE as u64)
}

/// Length of block `index` of a file of `size` bytes (0 past the end).
pub fn block_len(size: u64, index: u64) -> u64 {
    let start = index.saturating_mul(BLOCK_SIZE as u64);
    size.saturating_sub(start).min(BLOCK_SIZE as u64)
}

/// BLAKE3 of a full all-zero block (computed once): what a hole in a sparse file hashes to.
pub fn zero_block_hash() -> [u8; 32] {
    static HASH: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    *HASH.get_or_init(|| *blake3::hash(&vec![0u8; BLOCK_SIZE]).as_bytes())
}

/// Most ranges one file's `need_ranges` may carry in a Want. The Want frame is capped at 64 KiB;
/// a receiver whose resume state is more fragmented than this asks for more blocks instead.
pub const MAX_WANT_RANGES: usize = 256;

/// An LSB-first bitmap: bit i is byte i / 8, mask 1 << (i % 8) (`need_blocks` of Want and
/// NeedBlocks).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bitmap(Vec<u8>);

impl Bitmap {
    /// `bits` bits, all clear.
    pub fn with_len(bits: usize) -> Self {
        Self(vec![0; bits.div_ceil(8)])
    }

    pub fn set(&mut self, i: usize) {
        if let Some(b) = self.0.get_mut(i / 8) {
            *b |= 1 << (i % 8);
        }
    }

    /// Bit `i` of `bytes` (clear past the end).
    pub fn get(bytes: &[u8], i: u64) -> bool {
        usize::try_from(i / 8)
            .ok()
            .and_then(|byte| bytes.get(byte))
            .is_some_and(|b| b & (1 << (i % 8)) != 0)
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockSetError {
    #[error("block ranges are not (first, count) pairs")]
    OddLength,
    #[error("block range {first}+{count} is empty, overlaps or is out of order")]
    Disorder { first: u64, count: u64 },
    #[error("block range {first}+{count} runs past the last block of the file ({nblocks} blocks)")]
    PastEnd {
        first: u64,
        count: u64,
        nblocks: u64,
    },
}

/// A set of block indexes as sorted, disjoint, non-adjacent ranges `[start, end)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockSet {
    ranges: BTreeMap<u64, u64>,
    len: u64,
}

impl BlockSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every index in `0..n`.
    pub fn full(n: u64) -> Self {
        let mut s = Self::new();
        s.insert_range(0, n);
        s
    }

    /// Number of indexes in the set.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of ranges (what the set costs in memory and on the wire).
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// The range holding `i`, if any.
    fn range_of(&self, i: u64) -> Option<(u64, u64)> {
        self.ranges
            .range(..=i)
            .next_back()
            .filter(|(_, end)| i < **end)
            .map(|(s, e)| (*s, *e))
    }

    pub fn contains(&self, i: u64) -> bool {
        self.range_of(i).is_some()
    }

    /// Adds `start..end`, merging with neighbours.
    pub fn insert_range(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut lo, mut hi) = (start, end);
        // Every range that overlaps or touches [start, end] is absorbed.
        let touching: Vec<(u64, u64)> = self
            .ranges
            .range(..=end)
            .rev()
            .take_while(|(_, e)| **e >= start)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in touching {
            self.ranges.remove(&s);
            self.len -= e - s;
            lo = lo.min(s);
            hi = hi.max(e);
        }
        self.ranges.insert(lo, hi);
        self.len += hi - lo;
    }

    /// Adds `i`; false if it was there.
    pub fn insert(&mut self, i: u64) -> bool {
        if self.contains(i) {
            return false;
        }
        self.insert_range(i, i.saturating_add(1));
        true
    }

    /// Removes `i`; false if it was not there.
    pub fn remove(&mut self, i: u64) -> bool {
        let Some((s, e)) = self.range_of(i) else {
            return false;
        };
        self.ranges.remove(&s);
        if s < i {
            self.ranges.insert(s, i);
        }
        if i + 1 < e {
            self.ranges.insert(i + 1, e);
        }
        self.len -= 1;
        true
    }

    /// The ranges as `(start, end)`, in order.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(s, e)| (*s, *e))
    }

    /// Every index, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges().flat_map(|(s, e)| s..e)
    }

    /// The indexes of `0..n` not in the set, in order.
    pub fn complement(&self, n: u64) -> BlockSet {
        let mut out = BlockSet::new();
        let mut at = 0;
        for (s, e) in self.ranges() {
            if s >= n {
                break;
            }
            out.insert_range(at, s);
            at = e;
        }
        out.insert_range(at, n);
        out
    }

    /// `need_ranges` form: (first, count) pairs.
    pub fn to_wire(&self) -> Vec<u64> {
        self.ranges().flat_map(|(s, e)| [s, e - s]).collect()
    }

    /// Parses `need_ranges` of a file of `nblocks` blocks: sorted, disjoint, non-empty pairs
    /// within the file.
    pub fn from_wire(pairs: &[u64], nblocks: u64) -> Result<Self, BlockSetError> {
        if !pairs.len().is_multiple_of(2) {
            return Err(BlockSetError::OddLength);
        }
        let mut out = Self::new();
        let mut at = 0u64;
        for p in pairs.chunks_exact(2) {
            let (first, count) = (p[0], p[1]);
            if count == 0 || first < at {
                return Err(BlockSetError::Disorder { first, count });
            }
            let end = first.checked_add(count).filter(|e| *e <= nblocks).ok_or(
                BlockSetError::PastEnd {
                    first,
                    count,
                    nblocks,
                },
            )?;
            out.insert_range(first, end);
            at = end;
        }
        Ok(out)
    }

    /// The set bits of an LSB-first bitmap, below `nblocks`.
    pub fn from_bitmap(bytes: &[u8], nblocks: u64) -> Self {
        let mut out = Self::new();
        let mut run: Option<u64> = None;
        let bits = (bytes.len() as u64).saturating_mul(8).min(nblocks);
        for i in 0..bits {
            match (Bitmap::get(bytes, i), run) {
                (true, None) => run = Some(i),
                (false, Some(s)) => {
                    out.insert_range(s, i);
                    run = None;
                }
                _ => {}
            }
        }
        if let Some(s) = run {
            out.insert_range(s, bits);
        }
        out
    }

    /// This set of needed blocks of a file of `nblocks` blocks as a Want carries it
    /// (`need_blocks`, `need_ranges`): both empty for all blocks, a single clear bitmap byte for
    /// none, ranges otherwise.
    pub fn to_want(&self, nblocks: u64) -> (Vec<u8>, Vec<u64>) {
        if self.len == nblocks {
            (Vec::new(), Vec::new())
        } else if self.is_empty() {
            (vec![0], Vec::new())
        } else {
            (Vec::new(), self.to_wire())
        }
    }

    /// The blocks a Want asks for: its ranges, else its bitmap, else (both empty) all of them.
    pub fn from_want(
        need_blocks: &[u8],
        need_ranges: &[u64],
        nblocks: u64,
    ) -> Result<Self, BlockSetError> {
        if !need_ranges.is_empty() {
            Self::from_wire(need_ranges, nblocks)
        } else if !need_blocks.is_empty() {
            Ok(Self::from_bitmap(need_blocks, nblocks))
        } else {
            Ok(Self::full(nblocks))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry() {
        let b = BLOCK_SIZE as u64;
        assert_eq!(block_count(0), 0);
        assert_eq!(block_count(1), 1);
        assert_eq!(block_count(b), 1);
        assert_eq!(block_count(b + 1), 2);
        assert_eq!(block_count(u64::MAX), u64::MAX / b + 1);
        assert_eq!(block_len(b + 1, 0), b);
        assert_eq!(block_len(b + 1, 1), 1);
        assert_eq!(block_len(b + 1, 2), 0);
        assert_eq!(block_len(u64::MAX, u64::MAX), 0, "no overflow");
    }

    #[test]
    fn a_huge_file_is_one_range() {
        let n = block_count(u64::MAX);
        let mut s = BlockSet::full(n);
        assert_eq!(s.len(), n);
        assert_eq!(s.range_count(), 1);
        assert!(s.remove(n / 2));
        assert!(!s.remove(n / 2));
        assert_eq!(s.range_count(), 2);
        assert!(s.insert(n / 2));
        assert_eq!(s, BlockSet::full(n));
        assert_eq!(s.to_wire(), vec![0, n]);
    }

    #[test]
    fn insert_merges_and_remove_splits() {
        let mut s = BlockSet::new();
        for i in [5, 7, 6, 1, 0, 9] {
            assert!(s.insert(i));
        }
        assert!(!s.insert(6));
        assert_eq!(s.ranges().collect::<Vec<_>>(), [(0, 2), (5, 8), (9, 10)]);
        assert_eq!(s.len(), 6);
        s.insert_range(2, 9);
        assert_eq!(s.ranges().collect::<Vec<_>>(), [(0, 10)]);
        assert!(s.remove(0));
        assert!(s.remove(9));
        assert!(s.remove(4));
        assert_eq!(s.ranges().collect::<Vec<_>>(), [(1, 4), (5, 9)]);
        assert_eq!(s.iter().collect::<Vec<_>>(), [1, 2, 3, 5, 6, 7, 8]);
        assert_eq!(
            s.complement(12).ranges().collect::<Vec<_>>(),
            [(0, 1), (4, 5), (9, 12)]
        );
    }

    #[test]
    fn wire_ranges_round_trip_and_malformed_ones_are_refused() {
        let mut s = BlockSet::new();
        s.insert_range(3, 10);
        s.insert_range(600_000, 600_001);
        let w = s.to_wire();
        assert_eq!(w, [3, 7, 600_000, 1]);
        assert_eq!(BlockSet::from_wire(&w, 600_001).unwrap(), s);
        assert_eq!(
            BlockSet::from_wire(&w, 600_000),
            Err(BlockSetError::PastEnd {
                first: 600_000,
                count: 1,
                nblocks: 600_000
            })
        );
        assert!(BlockSet::from_wire(&[1], 10).is_err());
        assert!(BlockSet::from_wire(&[1, 0], 10).is_err());
        assert!(BlockSet::from_wire(&[5, 2, 4, 1], 10).is_err());
        assert!(BlockSet::from_wire(&[u64::MAX, 2], u64::MAX).is_err());
    }

    #[test]
    fn a_want_for_a_file_over_two_tib_fits_in_a_control_frame() {
        use crate::wire::{MAX_CONTROL_PAYLOAD, Message};
        use ferry_proto::wire::v1 as pb;
        // 2 TiB + 1 block: its bitmap alone would exceed the 64 KiB cap.
        let nblocks = (2u64 << 40) / BLOCK_SIZE as u64 + 1;
        assert!(nblocks.div_ceil(8) > u64::from(MAX_CONTROL_PAYLOAD));
        // Worst case the receiver sends: MAX_WANT_RANGES ranges at the far end of the file.
        let mut need = BlockSet::new();
        for k in 0..MAX_WANT_RANGES as u64 {
            need.insert(nblocks - 1 - 2 * k);
        }
        let want = Message::Want(pb::Want {
            offer_id: u64::MAX,
            entries: vec![pb::EntryWant {
                skip: false,
                need_blocks: Vec::new(),
                file_id: u64::MAX,
                need_ranges: need.to_wire(),
            }],
        });
        let mut buf = bytes::BytesMut::new();
        want.encode(&mut buf).expect("fits");
        let frame = crate::wire::decode_frame(&mut buf).unwrap().unwrap();
        let Message::Want(back) = Message::decode(frame).unwrap() else {
            panic!("not a Want");
        };
        let e = &back.entries[0];
        assert_eq!(
            BlockSet::from_want(&e.need_blocks, &e.need_ranges, nblocks).unwrap(),
            need
        );
    }

    #[test]
    fn bitmaps_and_the_old_want_form() {
        let mut b = Bitmap::with_len(20);
        for i in [0, 1, 2, 9, 19] {
            b.set(i);
        }
        let bytes = b.into_bytes();
        assert_eq!(bytes.len(), 3);
        assert!(Bitmap::get(&bytes, 9));
        assert!(!Bitmap::get(&bytes, 10));
        assert!(!Bitmap::get(&bytes, 1 << 40), "past the end is clear");
        let s = BlockSet::from_bitmap(&bytes, 20);
        assert_eq!(s.ranges().collect::<Vec<_>>(), [(0, 3), (9, 10), (19, 20)]);
        assert_eq!(
            BlockSet::from_bitmap(&bytes, 19).ranges().last(),
            Some((9, 10))
        );
        assert_eq!(BlockSet::from_want(&[], &[], 7).unwrap(), BlockSet::full(7));
        for set in [BlockSet::full(7), BlockSet::new(), s.clone()] {
            let (b, r) = set.to_want(20.max(set.len()));
            assert_eq!(BlockSet::from_want(&b, &r, 20.max(set.len())).unwrap(), set);
        }
        assert_eq!(BlockSet::from_want(&bytes, &[], 20).unwrap(), s);
        assert_eq!(
            BlockSet::from_want(&bytes, &[4, 1], 20).unwrap(),
            BlockSet::from_wire(&[4, 1], 20).unwrap()
        );
    }

    /// The fuzz target's properties (`mover/fuzz/fuzz_targets/want_blocks.rs`) over random
    /// inputs, so they also hold on stable: no panic, size bounded by what was sent, round trip.
    #[test]
    fn random_want_inputs_parse_within_bounds_and_round_trip() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let nblocks = match next() % 4 {
                0 => next(),
                1 => next() % 64,
                _ => next() % 100_000,
            };
            let bitmap: Vec<u8> = (0..next() % 16).map(|_| next() as u8).collect();
            let pairs: Vec<u64> = (0..next() % 12)
                .map(|_| match next() % 3 {
                    0 => next(),
                    _ => next() % 200,
                })
                .collect();
            if let Ok(set) = BlockSet::from_want(&bitmap, &pairs, nblocks) {
                assert!(set.range_count() <= pairs.len() / 2 + bitmap.len() * 4 + 1);
                assert!(set.len() <= nblocks);
                let (b, r) = set.to_want(nblocks);
                assert_eq!(BlockSet::from_want(&b, &r, nblocks).ok(), Some(set));
            }
        }
    }
}
