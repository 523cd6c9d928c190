//! `kubectl ferry watch`: the state of one Transfer as a single progress line, and the outcome
//! once it finished. Pure: the caller feeds each version of the Transfer it sees.

use super::format::{human_bytes, human_duration, human_rate, progress_bar};
use super::get::phase_cell;
use ferry_api::{Phase, Transfer, TransferStatus};

/// Cells of the progress bar.
pub const BAR_WIDTH: usize = 24;

/// How a watched Transfer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The final line, "Succeeded: ...".
    Succeeded(String),
    /// The final line, "Failed: <reason>: <message>".
    Failed(String),
}

/// What to show after one more version of the Transfer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Step {
    /// A new progress line (None when it would repeat the last one).
    pub line: Option<String>,
    /// Set once the Transfer finished.
    pub outcome: Option<Outcome>,
}

/// The last line shown, so that unchanged versions print nothing.
#[derive(Debug, Default)]
pub struct Watch {
    last: Option<String>,
}

impl Watch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn step(&mut self, t: &Transfer) -> Step {
        let empty = TransferStatus::default();
        let st = t.status.as_ref().unwrap_or(&empty);
        let line = progress_line(st);
        let line = (self.last.as_deref() != Some(line.as_str())).then(|| {
            self.last = Some(line.clone());
            line
        });
        Step {
            line,
            outcome: outcome(st),
        }
    }

    /// The last progress line shown.
    pub fn last_line(&self) -> Option<&str> {
        self.last.as_deref()
    }
}

/// `Running  [=====>    ]  37%  3.0 GiB/8.0 GiB  48.0 MiB/s  ETA 2m8s  attempt 2`.
pub fn progress_line(st: &TransferStatus) -> String {
    let mut parts = vec![format!("{:<9}", phase_cell(st))];
    let percent = st.progress.as_ref().map_or(0, |p| p.percent);
    parts.push(format!(
        "{} {percent:>3}%",
        progress_bar(percent, BAR_WIDTH)
    ));
    if let Some(p) = &st.progress {
        parts.push(format!(
            "{}/{}{}",
            human_bytes(p.bytes_done),
            human_bytes(p.bytes_total),
            if p.totals_final { "" } else { "+" }
        ));
    }
    if let Some(t) = &st.throughput
        && st.phase == Phase::Running
    {
        parts.push(human_rate(t.current_bytes_per_second));
    }
    if let Some(eta) = &st.eta {
        parts.push(format!("ETA {eta}"));
    }
    if st.attempts > 0 {
        parts.push(format!("attempt {}", st.attempts));
    }
    parts.join("  ")
}

/// The outcome once the Transfer is Succeeded or Failed.
pub fn outcome(st: &TransferStatus) -> Option<Outcome> {
    match st.phase {
        Phase::Succeeded => Some(Outcome::Succeeded(success_line(st))),
        Phase::Failed => Some(Outcome::Failed(failure_line(st))),
        _ => None,
    }
}

/// "Succeeded: 601 files, 24.0 MiB in 6s (average 4.0 MiB/s)".
fn success_line(st: &TransferStatus) -> String {
    let mut line = String::from("Succeeded");
    if let Some(p) = &st.progress {
        line.push_str(&format!(
            ": {} files, {}",
            p.files_done,
            human_bytes(p.bytes_done)
        ));
        if p.files_skipped > 0 {
            line.push_str(&format!(" ({} files unchanged)", p.files_skipped));
        }
        if let (Some(start), Some(end)) = (&st.start_time, &st.completion_time) {
            let secs = (end.0.as_second() - start.0.as_second()).max(0) as u64;
            line.push_str(&format!(" in {}", human_duration(secs)));
        }
        if let Some(t) = st
            .throughput
            .as_ref()
            .filter(|t| t.average_bytes_per_second > 0)
        {
            line.push_str(&format!(
                " (average {})",
                human_rate(t.average_bytes_per_second)
            ));
        }
    }
    line
}

/// "Failed: SourceUnreadable: ..." from the Failed condition, else `lastError`.
fn failure_line(st: &TransferStatus) -> String {
    let failed = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Failed" && c.status == "True")
        .map(|c| (c.reason.as_str(), c.message.as_str()));
    let last = st
        .last_error
        .as_ref()
        .map(|e| (e.reason.as_str(), e.message.as_str()));
    match failed.or(last) {
        Some((reason, message)) if !message.is_empty() => format!("Failed: {reason}: {message}"),
        Some((reason, _)) => format!("Failed: {reason}"),
        None => "Failed".to_owned(),
    }
}

/// What to write for a new progress line: on a terminal the line replaces the previous one
/// (carriage return, erase to the end of the line); elsewhere it is a line of its own.
pub fn frame(line: &str, tty: bool) -> String {
    if tty {
        format!("\r{line}\x1b[K")
    } else {
        format!("{line}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::super::get::tests::{at, running, transfer};
    use super::*;
    use ferry_api::LastError;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    #[test]
    fn a_running_transfer_is_one_line_with_bar_figures_rate_eta_and_attempt() {
        assert_eq!(
            progress_line(&running()),
            "Running    [=======>                ]  37%  3.0 GiB/8.0 GiB  48.0 MiB/s  ETA 2m8s  attempt 2"
        );
        assert_eq!(
            progress_line(&TransferStatus::default()),
            "Pending    [                        ]   0%"
        );
    }

    #[test]
    fn unchanged_versions_print_nothing_and_success_ends_the_watch() {
        let mut w = Watch::new();
        let t = transfer("x", Some(running()));
        let first = w.step(&t);
        assert!(first.line.is_some() && first.outcome.is_none());
        assert_eq!(w.step(&t), Step::default());
        let mut st = running();
        st.phase = Phase::Succeeded;
        st.eta = None;
        st.start_time = Some(at(100));
        st.completion_time = Some(at(100 + 205));
        if let Some(p) = st.progress.as_mut() {
            (p.bytes_done, p.files_done, p.percent) = (p.bytes_total, p.files_total, 100);
            p.files_skipped = 3;
        }
        let last = w.step(&transfer("x", Some(st)));
        assert_eq!(
            last.line.as_deref(),
            Some("Succeeded  [========================] 100%  8.0 GiB/8.0 GiB  attempt 2")
        );
        assert_eq!(
            last.outcome,
            Some(Outcome::Succeeded(
                "Succeeded: 1281 files, 8.0 GiB (3 files unchanged) in 3m25s (average 40.0 MiB/s)"
                    .into()
            ))
        );
        assert_eq!(w.last_line(), last.line.as_deref());
    }

    #[test]
    fn failure_names_the_reason_and_message() {
        let mut st = running();
        st.phase = Phase::Failed;
        st.last_error = Some(LastError {
            reason: "MoverFailed".into(),
            message: "older".into(),
        });
        assert_eq!(
            outcome(&st),
            Some(Outcome::Failed("Failed: MoverFailed: older".into()))
        );
        st.conditions.push(Condition {
            type_: "Failed".into(),
            status: "True".into(),
            reason: "SourceUnreadable".into(),
            message: "cannot read /ferry/data/private: permission denied".into(),
            observed_generation: None,
            last_transition_time: at(0),
        });
        assert_eq!(
            outcome(&st),
            Some(Outcome::Failed(
                "Failed: SourceUnreadable: cannot read /ferry/data/private: permission denied"
                    .into()
            ))
        );
        st.phase = Phase::Retrying;
        assert_eq!(outcome(&st), None);
    }

    #[test]
    fn frames_rewrite_the_line_only_on_a_terminal() {
        assert_eq!(frame("a", true), "\ra\x1b[K");
        assert_eq!(frame("a", false), "a\n");
        assert!(!frame("a", false).contains(['\r', '\x1b']));
    }
}
