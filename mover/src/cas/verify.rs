//! Operator views of a store: statistics and a full scrub.

use std::time::SystemTime;

use serde::Serialize;

use super::error::Result;
use super::gc::clean_stale_temps;
use super::lease::scan_leases;
use super::scan::scan_blocks;
use super::store::CasStore;
use super::usage;

/// At most this many bad hashes are listed in a report (all are counted).
const MAX_LISTED: usize = 100;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StoreStats {
    pub dir: String,
    pub blocks: u64,
    pub bytes: u64,
    pub cap_bytes: Option<u64>,
    /// Last use of the least / most recently used block, seconds since the Unix epoch.
    pub oldest_access_unix: Option<u64>,
    pub newest_access_unix: Option<u64>,
    pub live_leases: u64,
    pub expired_leases: u64,
    /// Files under blocks/ not named like a block (never served, never deleted).
    pub stray_files: u64,
    /// The on-disk running count that inserts maintain between scans.
    pub usage_counter_bytes: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VerifyReport {
    pub dir: String,
    pub blocks_checked: u64,
    pub bytes_checked: u64,
    pub bad_blocks_discarded: u64,
    /// The first bad hashes (up to 100).
    pub bad_hashes: Vec<String>,
    pub stale_temps_removed: u64,
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl CasStore {
    /// Counts blocks and bytes with one directory scan (read-only: removes nothing).
    pub fn stats(&self) -> Result<StoreStats> {
        let layout = self.layout();
        let (mut blocks, mut bytes) = (0u64, 0u64);
        let (mut oldest, mut newest): (Option<SystemTime>, Option<SystemTime>) = (None, None);
        let extra = scan_blocks(layout, |c| {
            blocks += 1;
            bytes += c.len;
            oldest = Some(oldest.map_or(c.last_used, |o| o.min(c.last_used)));
            newest = Some(newest.map_or(c.last_used, |n| n.max(c.last_used)));
            Ok(())
        })?;
        let leases = scan_leases(layout, false)?;
        Ok(StoreStats {
            dir: self.dir().display().to_string(),
            blocks,
            bytes,
            cap_bytes: self.cap_bytes(),
            oldest_access_unix: oldest.map(unix_secs),
            newest_access_unix: newest.map(unix_secs),
            live_leases: leases.live,
            expired_leases: leases.expired_removed,
            stray_files: extra.stray_files,
            usage_counter_bytes: usage::get(&layout.usage())?,
        })
    }

    /// Re-hashes every block, discarding those whose content does not match their name, without
    /// refreshing anyone's last-use time. Also removes temps of dead writers.
    pub fn verify_all(&self) -> Result<VerifyReport> {
        let layout = self.layout();
        let mut report = VerifyReport {
            dir: self.dir().display().to_string(),
            blocks_checked: 0,
            bytes_checked: 0,
            bad_blocks_discarded: 0,
            bad_hashes: Vec::new(),
            stale_temps_removed: clean_stale_temps(layout)? + self.take_temps_removed_on_open(),
        };
        let extra = scan_blocks(layout, |c| {
            report.blocks_checked += 1;
            match self.read_checked(&c.hash, false)? {
                Some(bytes) => report.bytes_checked += bytes.len() as u64,
                None => {
                    report.bad_blocks_discarded += 1;
                    if report.bad_hashes.len() < MAX_LISTED {
                        report.bad_hashes.push(c.hash.to_hex());
                    }
                }
            }
            Ok(())
        })?;
        // A directory, FIFO or link under a block name is corrupt too: it would make the hash
        // unstorable (or hang a reader).
        for hash in extra.not_regular {
            report.blocks_checked += 1;
            report.bad_blocks_discarded += 1;
            self.discard(&hash, 0, "is not a regular file");
            if report.bad_hashes.len() < MAX_LISTED {
                report.bad_hashes.push(hash.to_hex());
            }
        }
        Ok(report)
    }
}
