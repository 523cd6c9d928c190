//! `ferry-mover copy SRC DST`: flags, progress bar, summary, exit status.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;

use crate::copy::{CopyOptions, copy_tree};
use crate::report::{Progress, ProgressBar};

#[derive(clap::Args, Debug)]
pub struct CopyArgs {
    /// Source directory (its contents are copied into DST), or a single file (copied into DST
    /// under its own name).
    pub src: PathBuf,
    /// Destination directory (created if missing).
    pub dst: PathBuf,
    /// Files copied in parallel (default: twice the number of CPUs, at most 64).
    #[arg(short, long)]
    pub jobs: Option<usize>,
    /// fsync every file and directory before reporting success.
    #[arg(long)]
    pub sync: bool,
    /// Skip files whose BLAKE3 matches instead of those whose size and mtime match.
    #[arg(short, long)]
    pub checksum: bool,
    /// Remove destination entries that are not in the source.
    #[arg(long)]
    pub delete: bool,
    /// Copy user.* extended attributes.
    #[arg(long)]
    pub xattrs: bool,
    /// Show what would be copied and deleted (with -v or -i, each entry), change nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Print one JSON summary line on stdout (and no progress bar).
    #[arg(long)]
    pub json: bool,
    /// At most this many bytes per second written, all workers together (`50M` = 50 000 000,
    /// `1Gi` = 2^30, as a Transfer's bandwidthLimit); 0 means no limit.
    #[arg(long, value_parser = crate::quantity::bandwidth_limit)]
    pub bandwidth_limit: Option<u64>,
    #[command(flatten)]
    pub filter: super::filter::FilterArgs,
}

/// Exit status 0 when everything was copied, 1 when some entries failed (each reported on
/// stderr); whole-command failures return an error (exit status 2).
pub fn run(args: CopyArgs) -> anyhow::Result<ExitCode> {
    let mut opts = CopyOptions {
        sync: args.sync,
        checksum: args.checksum,
        delete: args.delete,
        xattrs: args.xattrs,
        bandwidth_limit: args.bandwidth_limit.filter(|&bps| bps > 0),
        filter: args.filter.compile()?,
        ..CopyOptions::default()
    };
    if let Some(jobs) = args.jobs {
        anyhow::ensure!(jobs > 0, "--jobs must be at least 1");
        opts.jobs = jobs;
    }
    raise_open_file_limit();
    if args.dry_run {
        let summary = crate::copy::plan_tree(&args.src, &args.dst, &opts).with_context(|| {
            format!(
                "failed to plan a copy of {} to {}",
                args.src.display(),
                args.dst.display()
            )
        })?;
        return finish(&summary, args.json, true);
    }
    let progress = Arc::new(Progress::new("local", "copy"));
    let bar = ProgressBar::start(progress.clone(), !args.json);
    let result = copy_tree(&args.src, &args.dst, &opts, progress);
    bar.finish();
    let summary = result.with_context(|| {
        format!(
            "failed to copy {} to {}",
            args.src.display(),
            args.dst.display()
        )
    })?;
    finish(&summary, args.json, false)
}

fn finish(
    summary: &crate::report::CopySummary,
    json: bool,
    dry_run: bool,
) -> anyhow::Result<ExitCode> {
    if json {
        let mut v = serde_json::to_value(summary)?;
        if dry_run {
            v["dry_run"] = true.into();
        }
        println!("{v}");
    } else if !crate::report::quiet() {
        let prefix = if dry_run {
            "dry run, nothing changed: would have "
        } else {
            ""
        };
        eprintln!("{prefix}{}", summary.human());
    }
    Ok(if summary.failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The scan keeps one source and one destination directory open per level of depth, plus the
/// handles queued for workers; lift the soft limit on open files to the hard limit so deep trees
/// do not run out (the default soft limit is often 1024).
fn raise_open_file_limit() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::Nofile, raised) {
            tracing::debug!("could not raise the open-file limit: {e}");
        }
    }
}
