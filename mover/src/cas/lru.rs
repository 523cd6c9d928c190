//! Eviction order, as a pure policy: least recently used first, never a pinned block, and with a
//! bounded number of candidates held in memory however large the store is.

use std::collections::{BinaryHeap, HashSet};
use std::time::SystemTime;

use super::hash::BlockHash;

/// One block as a store scan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Candidate {
    /// Last use (the block file's mtime, which the store touches on every verified read).
    pub last_used: SystemTime,
    pub hash: BlockHash,
    pub len: u64,
}

/// Keeps the `limit` least recently used of everything pushed through it: a max-heap on last use
/// whose top (the newest kept) is dropped when it grows past `limit`. Memory is O(limit).
pub struct OldestK {
    limit: usize,
    heap: BinaryHeap<Candidate>,
}

impl OldestK {
    pub fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        Self {
            limit,
            heap: BinaryHeap::with_capacity(limit + 1),
        }
    }

    pub fn push(&mut self, c: Candidate) {
        if self.heap.len() < self.limit {
            self.heap.push(c);
        } else if self.heap.peek().is_some_and(|top| c < *top) {
            self.heap.pop();
            self.heap.push(c);
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// The kept candidates, least recently used first.
    pub fn into_oldest_first(self) -> Vec<Candidate> {
        self.heap.into_sorted_vec()
    }
}

/// Chooses which of `oldest_first` to evict to bring `total_bytes` down to `target_bytes`,
/// skipping pinned blocks. Returns the victims in eviction order.
pub fn plan_eviction(
    oldest_first: &[Candidate],
    pinned: &HashSet<BlockHash>,
    total_bytes: u64,
    target_bytes: u64,
) -> Vec<Candidate> {
    let mut total = total_bytes;
    let mut victims = Vec::new();
    for c in oldest_first {
        if total <= target_bytes {
            break;
        }
        if pinned.contains(&c.hash) {
            continue;
        }
        total = total.saturating_sub(c.len);
        victims.push(*c);
    }
    victims
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cand(i: u64, secs: u64, len: u64) -> Candidate {
        Candidate {
            last_used: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
            hash: BlockHash::of(&i.to_le_bytes()),
            len,
        }
    }

    #[test]
    fn oldest_k_keeps_the_least_recently_used_in_order() {
        let mut k = OldestK::new(3);
        for (i, secs) in [50u64, 10, 40, 20, 60, 30].into_iter().enumerate() {
            k.push(cand(i as u64, secs, 1));
        }
        assert_eq!(k.len(), 3);
        let secs: Vec<u64> = k
            .into_oldest_first()
            .iter()
            .map(|c| {
                c.last_used
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_secs()
            })
            .collect();
        assert_eq!(secs, vec![10, 20, 30]);
    }

    #[test]
    fn eviction_stops_at_the_cap_and_goes_oldest_first() {
        let all: Vec<Candidate> = (0..5).map(|i| cand(i, 100 + i, 10)).collect();
        let victims = plan_eviction(&all, &HashSet::new(), 50, 25);
        // 50 -> 40 -> 30 -> 20: three oldest go, the two newest stay.
        assert_eq!(victims, all[..3].to_vec());
        assert!(plan_eviction(&all, &HashSet::new(), 50, 50).is_empty());
    }

    #[test]
    fn pinned_blocks_are_never_chosen() {
        let all: Vec<Candidate> = (0..5).map(|i| cand(i, 100 + i, 10)).collect();
        let pinned: HashSet<BlockHash> = [all[0].hash, all[1].hash].into_iter().collect();
        let victims = plan_eviction(&all, &pinned, 50, 25);
        assert_eq!(victims, vec![all[2], all[3], all[4]]);
        // Everything pinned: nothing to evict even though over target.
        let every: HashSet<BlockHash> = all.iter().map(|c| c.hash).collect();
        assert!(plan_eviction(&all, &every, 50, 0).is_empty());
    }
}
