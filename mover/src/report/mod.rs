//! The TTY progress bar and the end-of-run summary of a local copy (`--json`).
//!
//! [`ProgressBar`] draws the run's [`Progress`] counters (the same type the network commands and
//! the gRPC progress service use) on stderr when stderr is a terminal; [`Summary`] is the
//! machine-readable result.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

pub mod changes;

pub use crate::progress::Progress;

/// What the command line asked to see (`--quiet`, `--no-progress`), for every command.
static QUIET: AtomicBool = AtomicBool::new(false);
static NO_PROGRESS: AtomicBool = AtomicBool::new(false);

/// Set once from the command line: `quiet` drops the bar and the human summary (errors and
/// `--json` output stay), `no_progress` the bar alone.
pub fn configure(quiet: bool, no_progress: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
    NO_PROGRESS.store(no_progress || quiet, Ordering::Relaxed);
}

/// Whether human-readable summaries are wanted.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// A progress bar on stderr, redrawn by its own thread; finish it with [`ProgressBar::finish`].
pub struct ProgressBar {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ProgressBar {
    /// Starts a bar when `enabled` and stderr is a terminal; otherwise a no-op handle.
    pub fn start(progress: Arc<Progress>, enabled: bool) -> ProgressBar {
        let stop = Arc::new(AtomicBool::new(false));
        if !enabled || NO_PROGRESS.load(Ordering::Relaxed) || !std::io::stderr().is_terminal() {
            return ProgressBar { stop, thread: None };
        }
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || draw_loop(&progress, &flag))
            .ok();
        ProgressBar { stop, thread }
    }

    /// Stops and clears the bar.
    pub fn finish(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ProgressBar {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

fn draw_loop(progress: &Progress, stop: &AtomicBool) {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    let style = |template: &str| {
        indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    };
    // While the source is still being walked the total is only what was found so far: no bar
    // (it would sit near full) and no ETA, just what moved.
    let counting = style("{spinner} {msg}");
    let known = style("{bar:30.cyan/blue} {msg}");
    bar.set_style(counting.clone());
    let mut final_style = false;
    while !stop.load(Ordering::Relaxed) {
        let s = progress.snapshot();
        bar.set_message(status_line(&s));
        bar.set_length(s.bytes_total.max(s.bytes_done).max(1));
        bar.set_position(s.bytes_done);
        if s.totals_final && !final_style {
            bar.set_style(known.clone());
            final_style = true;
        }
        bar.tick();
        if s.phase.is_final() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
}

/// The text after the bar: bytes and files done of the total (`+` while the source is still
/// being walked), average rates, elapsed time, and an ETA only once the totals are final. Decimal
/// units, as the summary's MB/s.
pub fn status_line(s: &crate::progress::Snapshot) -> String {
    let plus = if s.totals_final { "" } else { "+" };
    let secs = s.elapsed.max(1e-3);
    let rate = s.bytes_done as f64 / secs;
    let eta = if s.totals_final && rate > 0.0 && s.bytes_total > s.bytes_done {
        format!(
            " ETA {}",
            clock((s.bytes_total - s.bytes_done) as f64 / rate)
        )
    } else {
        String::new()
    };
    let mut line = format!(
        "{}/{}{plus} {}/s, files {}/{}{plus} ({:.0}/s), {} elapsed{eta}",
        decimal(s.bytes_done as f64),
        decimal(s.bytes_total as f64),
        decimal(rate),
        s.files_done,
        s.files_total,
        s.files_done as f64 / secs,
        clock(s.elapsed),
    );
    if s.skipped > 0 {
        line.push_str(&format!(", {} unchanged", s.skipped));
    }
    if s.failed > 0 {
        line.push_str(&format!(", {} failed", s.failed));
    }
    line
}

/// `v` bytes in decimal units (`12.3 MB`), as everywhere a person reads sizes and rates.
pub fn decimal(v: f64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = v;
    let mut unit = 0;
    while v >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn clock(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// The result of a copy, printed as one JSON line with `--json`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CopySummary {
    /// Files copied (data written).
    pub files: u64,
    /// Bytes of file data written.
    pub bytes: u64,
    /// Entries left alone because the destination already matched.
    pub skipped: u64,
    /// Entries that could not be copied (each reported on stderr).
    pub failed: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    /// FIFOs, sockets and device nodes not copied (each warned about).
    pub specials_skipped: u64,
    /// Destination entries removed by `--delete`.
    pub deleted: u64,
    /// Stale temporary files of an earlier, interrupted run that were removed.
    pub temps_cleaned: u64,
}

impl CopySummary {
    /// One human-readable line for stderr.
    pub fn human(&self) -> String {
        format!(
            "copied {} files ({} bytes), {} dirs, {} symlinks, {} hard links; skipped {} unchanged, {} special; deleted {}; failed {}; {:.3} s",
            self.files,
            self.bytes,
            self.dirs,
            self.symlinks,
            self.hardlinks,
            self.skipped,
            self.specials_skipped,
            self.deleted,
            self.failed,
            self.seconds
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Snapshot;

    #[test]
    fn summary_json_has_the_documented_fields() {
        let s = CopySummary {
            files: 3,
            bytes: 10,
            skipped: 1,
            failed: 2,
            seconds: 0.5,
            ..Default::default()
        };
        let v: serde_json::Value = serde_json::to_value(&s).expect("json");
        for key in ["files", "bytes", "skipped", "failed", "seconds"] {
            assert!(v.get(key).is_some(), "{key} missing");
        }
        assert_eq!(v["files"], 3);
        assert_eq!(v["failed"], 2);
    }

    fn snap(done: u64, total: u64, files: (u64, u64), final_: bool, secs: f64) -> Snapshot {
        Snapshot {
            phase: crate::progress::Phase::Transferring,
            files_done: files.0,
            files_total: files.1,
            bytes_done: done,
            bytes_total: total,
            totals_final: final_,
            wire_bytes: 0,
            skipped: 0,
            failed: 0,
            resumed_bytes: 0,
            dedup_blocks: 0,
            dedup_bytes: 0,
            last_error: String::new(),
            error_kind: None,
            permanent: false,
            digest: String::new(),
            elapsed: secs,
            unreadable: Default::default(),
        }
    }

    #[test]
    fn no_eta_while_the_source_is_still_being_walked() {
        let line = status_line(&snap(97_000_000, 100_000_000, (97, 100), false, 2.0));
        assert_eq!(
            line,
            "97.0 MB/100.0 MB+ 48.5 MB/s, files 97/100+ (48/s), 2s elapsed"
        );
    }

    #[test]
    fn eta_from_the_average_rate_once_totals_are_final() {
        let line = status_line(&snap(50_000_000, 200_000_000, (5, 20), true, 10.0));
        assert_eq!(
            line,
            "50.0 MB/200.0 MB 5.0 MB/s, files 5/20 (0/s), 10s elapsed ETA 30s"
        );
        assert!(status_line(&snap(0, 10, (0, 1), true, 0.0)).ends_with("0s elapsed"));
    }

    #[test]
    fn progress_counts() {
        let p = Progress::new("local", "copy");
        p.add_total(2, 100);
        p.add_done(1, 40);
        p.add_failed(1);
        let s = p.snapshot();
        assert_eq!(
            (
                s.files_total,
                s.bytes_total,
                s.files_done,
                s.bytes_done,
                s.failed
            ),
            (2, 100, 1, 40, 1)
        );
        assert!(!s.totals_final);
        p.set_totals_known();
        assert!(p.snapshot().totals_final);
    }
}
