//! Garbage collection: evict least recently used unpinned blocks down to a target, remove temps of
//! dead writers and leases of dead holders. Memory is bounded by [`CANDIDATES_PER_ROUND`] plus the
//! pins of live leases, whatever the size of the store.

use std::fs::{self, File};
use std::io;
use std::time::SystemTime;

use serde::Serialize;

use super::error::{CasError, Result};
use super::layout::Layout;
use super::lease::scan_leases;
use super::lock;
use super::lru::{OldestK, plan_eviction};
use super::scan::scan_blocks;
use super::store::CasStore;
use super::usage;

/// How many eviction candidates one scan collects (4 GiB of 4 MiB blocks); bigger excesses take
/// several rounds.
pub const CANDIDATES_PER_ROUND: usize = 1024;

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct GcReport {
    pub target_bytes: u64,
    pub blocks_before: u64,
    pub bytes_before: u64,
    pub blocks_evicted: u64,
    pub bytes_evicted: u64,
    pub blocks_after: u64,
    pub bytes_after: u64,
    /// Pinned blocks the eviction had to skip.
    pub pinned_skipped: u64,
    pub stale_temps_removed: u64,
    pub expired_leases_removed: u64,
    pub live_leases: u64,
    pub reached_target: bool,
}

/// Deletes temp files in `tmp/` whose writer no longer holds their lock (it died mid-write).
pub fn clean_stale_temps(layout: &Layout) -> Result<u64> {
    let dir = layout.tmp();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(CasError::io("list temp files in", dir, e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(|e| CasError::io("list temp files in", &dir, e))?;
        let path = entry.path();
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(CasError::io("open temp file", path, e)),
        };
        // Holding the lock while unlinking: a writer cannot be mid-write on this file now.
        if lock::try_lock_file(&file).map_err(|e| CasError::io("probe temp lock", &path, e))? {
            match fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(CasError::io("remove stale temp file", path, e)),
            }
        }
    }
    Ok(removed)
}

/// Runs a gc to `target_bytes`. With `wait == false` it returns `Ok(None)` at once if another gc
/// (in any process) is running.
pub fn collect(store: &CasStore, target_bytes: u64, wait: bool) -> Result<Option<GcReport>> {
    let layout = store.layout();
    let _gc = if wait {
        lock::exclusive(&layout.gc_lock())?
    } else {
        match lock::try_exclusive(&layout.gc_lock())? {
            Some(l) => l,
            None => return Ok(None),
        }
    };
    let mut report = GcReport {
        target_bytes,
        stale_temps_removed: clean_stale_temps(layout)? + store.take_temps_removed_on_open(),
        ..GcReport::default()
    };
    let mut first_round = true;
    loop {
        // Pins as a hint, so pinned blocks do not crowd the candidate list; re-read under the
        // exclusive lock before anything is deleted.
        let hint = scan_leases(layout, true)?;
        report.expired_leases_removed += hint.expired_removed;
        let mut oldest = OldestK::new(CANDIDATES_PER_ROUND);
        let (mut blocks, mut bytes, mut pinned) = (0u64, 0u64, 0u64);
        scan_blocks(layout, |c| {
            blocks += 1;
            bytes += c.len;
            if hint.pinned.contains(&c.hash) {
                pinned += 1;
            } else {
                oldest.push(c);
            }
            Ok(())
        })?;
        drop(hint);
        if first_round {
            report.blocks_before = blocks;
            report.bytes_before = bytes;
            first_round = false;
        }
        report.blocks_after = blocks;
        report.bytes_after = bytes;
        report.pinned_skipped = pinned;
        usage::set(&layout.usage(), bytes)?;
        if bytes <= target_bytes {
            report.reached_target = true;
            break;
        }
        let candidates = oldest.into_oldest_first();
        let exhaustive = candidates.len() < CANDIDATES_PER_ROUND;

        let _exclusive = lock::exclusive(&layout.lock())?;
        let leases = scan_leases(layout, true)?;
        report.live_leases = leases.live;
        let victims = plan_eviction(&candidates, &leases.pinned, bytes, target_bytes);
        let mut evicted_now = 0u64;
        for v in &victims {
            let path = layout.block(&v.hash);
            // Used since the scan? Then it is no longer least recently used: keep it.
            match fs::symlink_metadata(&path) {
                Ok(m) if m.modified().unwrap_or(SystemTime::UNIX_EPOCH) == v.last_used => {}
                _ => continue,
            }
            match fs::remove_file(&path) {
                Ok(()) => {
                    evicted_now += 1;
                    report.blocks_evicted += 1;
                    report.bytes_evicted += v.len;
                    report.blocks_after -= 1;
                    report.bytes_after -= v.len;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(CasError::io("evict block", path, e)),
            }
        }
        drop(_exclusive);
        usage::set(&layout.usage(), report.bytes_after)?;
        if report.bytes_after <= target_bytes {
            report.reached_target = true;
            break;
        }
        if evicted_now == 0 || exhaustive {
            // Everything left is pinned (or in use right now): the store stays over target.
            report.reached_target = false;
            break;
        }
    }
    Ok(Some(report))
}

impl CasStore {
    /// Evicts down to `target_bytes` (or the store's cap when `None`, or only cleans up when the
    /// store has no cap), waiting for a concurrent gc to finish first.
    pub fn gc(&self, target_bytes: Option<u64>) -> Result<GcReport> {
        let target = target_bytes.or(self.cap_bytes()).unwrap_or(u64::MAX);
        collect(self, target, true)?.ok_or_else(|| {
            CasError::io(
                "take gc lock on",
                self.layout().gc_lock(),
                io::Error::from(io::ErrorKind::WouldBlock),
            )
        })
    }
}
