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
    let style = indicatif::ProgressStyle::with_template(
        "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    while !stop.load(Ordering::Relaxed) {
        let s = progress.snapshot();
        bar.set_length(s.bytes_total.max(s.bytes_done));
        bar.set_position(s.bytes_done);
        let total = if s.totals_final {
            s.files_total.to_string()
        } else {
            format!("{}+", s.files_total)
        };
        bar.set_message(format!(
            "files {}/{} skipped {} failed {}",
            s.files_done, total, s.skipped, s.failed
        ));
        if s.phase.is_final() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
}

/// The result of a copy, printed as one JSON line with `--json`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
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

impl Summary {
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

    #[test]
    fn summary_json_has_the_documented_fields() {
        let s = Summary {
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
