//! `ferry-mover cas stats|verify|gc|import DIR`: operator tools for a node's block store.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use crate::cas::{BLOCK_SIZE, BlockHash, CasOptions, CasStore, InsertOutcome};

#[derive(clap::Subcommand, Debug)]
pub enum CasCommand {
    /// Print block count, bytes, cap and oldest/newest access.
    Stats {
        dir: PathBuf,
        /// Machine-readable output on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Re-hash every block and discard bad ones (exit code 1 if any were bad).
    Verify {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Evict least recently used unpinned blocks down to the cap; remove stale temps and expired
    /// leases.
    Gc {
        dir: PathBuf,
        /// Target size in bytes (default: the cap recorded in the store).
        #[arg(long)]
        cap: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Pre-seed a store with the full 4 MiB blocks of local files (creates the store if needed).
    Import {
        dir: PathBuf,
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Cap to record when creating the store.
        #[arg(long)]
        cap: Option<u64>,
        /// fsync each block before publishing it.
        #[arg(long)]
        sync: bool,
        #[arg(long)]
        json: bool,
        /// Crash tests only: stop forever halfway through writing the first block's temp file
        /// after printing `STALLED <temp path>`.
        #[arg(long, hide = true)]
        test_stall_mid_insert: bool,
    },
}

pub fn run(cmd: CasCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        CasCommand::Stats { dir, json } => {
            let store = open(&dir)?;
            let stats = store.stats()?;
            print(&stats, json, |s| {
                format!(
                    "store: {}\nblocks: {}\nbytes: {}\ncap: {}\noldest access: {}\nnewest access: {}\nlive leases: {}\nexpired leases: {}\nstray files: {}\n",
                    s.dir,
                    s.blocks,
                    s.bytes,
                    s.cap_bytes
                        .map_or("none recorded".into(), |c| c.to_string()),
                    fmt_time(s.oldest_access_unix),
                    fmt_time(s.newest_access_unix),
                    s.live_leases,
                    s.expired_leases,
                    s.stray_files,
                )
            })?;
            Ok(ExitCode::SUCCESS)
        }
        CasCommand::Verify { dir, json } => {
            let store = open(&dir)?;
            let report = store.verify_all()?;
            print(&report, json, |r| {
                let mut s = format!(
                    "store: {}\nblocks checked: {}\nbytes checked: {}\nbad blocks discarded: {}\nstale temps removed: {}\n",
                    r.dir,
                    r.blocks_checked,
                    r.bytes_checked,
                    r.bad_blocks_discarded,
                    r.stale_temps_removed
                );
                for h in &r.bad_hashes {
                    s.push_str(&format!("discarded: {h}\n"));
                }
                s
            })?;
            Ok(if report.bad_blocks_discarded > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        CasCommand::Gc { dir, cap, json } => {
            let store = open(&dir)?;
            let report = store.gc(cap)?;
            print(&report, json, |r| {
                format!(
                    "target bytes: {}\nbefore: {} blocks, {} bytes\nevicted: {} blocks, {} bytes\nafter: {} blocks, {} bytes\npinned (kept): {}\nlive leases: {}\nexpired leases removed: {}\nstale temps removed: {}\nreached target: {}\n",
                    r.target_bytes,
                    r.blocks_before,
                    r.bytes_before,
                    r.blocks_evicted,
                    r.bytes_evicted,
                    r.blocks_after,
                    r.bytes_after,
                    r.pinned_skipped,
                    r.live_leases,
                    r.expired_leases_removed,
                    r.stale_temps_removed,
                    r.reached_target
                )
            })?;
            Ok(ExitCode::SUCCESS)
        }
        CasCommand::Import {
            dir,
            files,
            cap,
            sync,
            json,
            test_stall_mid_insert,
        } => {
            let store = CasStore::open_with(
                &dir,
                CasOptions {
                    cap_bytes: cap,
                    fsync: sync,
                },
            )
            .with_context(|| format!("failed to open block store {}", dir.display()))?;
            let mut report = ImportReport::default();
            for file in &files {
                import_file(&store, file, test_stall_mid_insert, &mut report)?;
            }
            print(&report, json, |r| {
                format!(
                    "files: {}\nfull blocks: {}\ninserted: {}\nalready present: {}\n",
                    r.files, r.blocks, r.inserted, r.already_present
                )
            })?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[derive(Debug, Default, Serialize)]
struct ImportReport {
    files: u64,
    blocks: u64,
    inserted: u64,
    already_present: u64,
    bytes_inserted: u64,
}

fn open(dir: &Path) -> anyhow::Result<CasStore> {
    CasStore::open_existing(dir)
        .with_context(|| format!("failed to open block store {}", dir.display()))
}

/// Reads full blocks only: a file's tail block is never announced, so storing it buys nothing.
fn import_file(
    store: &CasStore,
    path: &Path,
    stall: bool,
    report: &mut ImportReport,
) -> anyhow::Result<()> {
    let mut f = File::open(path)
        .with_context(|| format!("failed to open {} for import", path.display()))?;
    let mut buf = vec![0u8; BLOCK_SIZE];
    report.files += 1;
    loop {
        let mut filled = 0;
        while filled < BLOCK_SIZE {
            let n = f
                .read(&mut buf[filled..])
                .with_context(|| format!("failed to read {}", path.display()))?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled < BLOCK_SIZE {
            return Ok(());
        }
        report.blocks += 1;
        let hash = BlockHash::of(&buf);
        let outcome = if stall {
            store.insert_with_stall(&hash, &buf, &stall_forever)?
        } else {
            store.insert(&hash, &buf)?
        };
        match outcome {
            InsertOutcome::Inserted => {
                report.inserted += 1;
                report.bytes_inserted += BLOCK_SIZE as u64;
            }
            InsertOutcome::AlreadyPresent => report.already_present += 1,
        }
    }
}

fn stall_forever(temp: &Path) {
    println!("STALLED {}", temp.display());
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

fn print<T: Serialize>(value: &T, json: bool, human: impl Fn(&T) -> String) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, value).context("failed to write JSON to stdout")?;
        writeln!(out).context("failed to write to stdout")?;
    } else {
        out.write_all(human(value).as_bytes())
            .context("failed to write to stdout")?;
    }
    Ok(())
}

fn fmt_time(unix: Option<u64>) -> String {
    unix.map_or("-".into(), |t| format!("{t} (unix seconds)"))
}
