//! When a Transfer's runs start and what is kept of them: the first run, a changed
//! `spec.trigger`, the schedule (its concurrency policy, its starting deadline, at most one
//! catch-up for times missed while nothing could start a run), and the history of finished
//! runs. Pure: the single-Transfer lifecycle and the fan-out share it.

pub mod cron;

use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{
    ConcurrencyPolicy, Phase, RunCause, RunRecord, RunResult, RunStart, ScheduleSpec, Transfer,
    TransferStatus,
};
use crate::plan::Note;
use cron::Cron;

/// Runs kept in `status.history` when `spec.historyLimit` is unset.
pub const DEFAULT_HISTORY_LIMIT: u32 = 10;

/// A schedule ready to answer "when": the expression and its time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    tz: TimeZone,
}

impl Schedule {
    /// `Err` says what is wrong, naming the field.
    pub fn parse(spec: &ScheduleSpec) -> Result<Schedule, String> {
        let cron = Cron::parse(&spec.cron).map_err(|e| format!("spec.schedule.cron: {e}"))?;
        let tz = match spec.time_zone.as_deref() {
            None | Some("") => TimeZone::UTC,
            Some(name) => TimeZone::get(name).map_err(|_| {
                format!(
                    "spec.schedule.timeZone: {name:?} is not a time zone of the IANA database (e.g. Europe/Berlin, America/New_York, UTC)"
                )
            })?,
        };
        let schedule = Schedule { cron, tz };
        // A fixed reference keeps this pure; every date that ever comes, comes within the
        // horizon from any start.
        if schedule.next_after(Timestamp::UNIX_EPOCH).is_none() {
            return Err(format!(
                "spec.schedule.cron: {:?} names a date that never comes",
                spec.cron
            ));
        }
        Ok(schedule)
    }

    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.cron.next_after(t, &self.tz)
    }

    /// The latest firing in `(after, now]`, if any. Searches windows ending at `now` that
    /// grow until one holds a firing, so that a long outage of an every-minute schedule costs
    /// a few dozen steps, not one per missed minute.
    pub fn latest(&self, after: Timestamp, now: Timestamp) -> Option<Timestamp> {
        const WINDOWS: [i64; 6] = [
            3_600,
            86_400,
            32 * 86_400,
            367 * 86_400,
            4 * 367 * 86_400,
            9 * 367 * 86_400,
        ];
        for secs in WINDOWS {
            let from = now
                .checked_sub(jiff::SignedDuration::from_secs(secs))
                .map_or(after, |f| f.max(after));
            let mut latest = None;
            let mut t = from;
            while let Some(next) = self.next_after(t).filter(|n| *n <= now) {
                latest = Some(next);
                t = next;
            }
            if latest.is_some() || from == after {
                return latest;
            }
        }
        None
    }
}

/// Why a run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The Transfer's first run.
    Created,
    /// `spec.trigger` changed after the last run finished.
    Triggered,
    /// The schedule fired at this time.
    Scheduled(Timestamp),
}

/// What the run rules ask for now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub start: Option<Start>,
    /// The current run gives way to the scheduled one (`concurrencyPolicy: Replace`).
    pub replace: bool,
    /// A scheduled time that passed without a run, and why.
    pub skip: Option<(Timestamp, String)>,
    /// When the schedule fires next (none: no schedule, suspended, invalid or never again).
    pub next: Option<Timestamp>,
    /// The earliest of several scheduled times that passed with no run (the operator was
    /// down, the Transfer suspended): one run catches them all up.
    pub missed_since: Option<Timestamp>,
    /// A scheduled time the run starting for another cause (the first, a trigger) serves, so
    /// that no second run starts for it.
    pub served: Option<Timestamp>,
}

/// The run rules for `t` with status `st` at `now`.
pub fn decide(t: &Transfer, st: &TransferStatus, now: Timestamp) -> Decision {
    let mut d = Decision::default();
    let finished = st.phase.is_finished();
    if st.run == 0 {
        d.start = Some(Start::Created);
    } else if finished && t.spec.trigger != st.observed_trigger {
        d.start = Some(Start::Triggered);
    }
    let Some(spec) = &t.spec.schedule else {
        return d;
    };
    // A suspended schedule fires nothing; the times it passes are caught up (once) on resume,
    // as CronJob does.
    if t.spec.suspend {
        return d;
    }
    let Ok(schedule) = Schedule::parse(spec) else {
        return d;
    };
    let created = t.metadata.creation_timestamp.as_ref().map_or(now, |c| c.0);
    // Scheduled times count from the last one acted on; a schedule new to the Transfer counts
    // from its current run's start (a time since then finds data older than it asks for).
    let after = st
        .last_schedule_time
        .as_ref()
        .or(st.start_time.as_ref())
        .map_or(created, |t| t.0);
    let due = schedule.latest(after, now);
    d.next = schedule.next_after(now.max(after));
    let Some(due) = due else {
        return d;
    };
    d.missed_since = schedule.next_after(after).filter(|first| *first < due);
    let late = Duration::try_from(now.duration_since(due)).unwrap_or_default();
    if let Some(deadline) = spec.starting_deadline_seconds
        && late > Duration::from_secs(deadline.max(0) as u64)
    {
        d.skip = Some((
            due,
            format!(
                "the run due at {due} could not start within startingDeadlineSeconds ({deadline} s)"
            ),
        ));
        return d;
    }
    match (d.start, finished, spec.concurrency_policy) {
        // The first run or a trigger starts now anyway: the due time is served by it.
        (Some(_), _, _) => d.served = Some(due),
        (None, true, _) => d.start = Some(Start::Scheduled(due)),
        (None, false, ConcurrencyPolicy::Replace) => {
            d.start = Some(Start::Scheduled(due));
            d.replace = true;
        }
        (None, false, ConcurrencyPolicy::Forbid) => {
            d.skip = Some((
                due,
                format!(
                    "run {} was still going at {due} (concurrencyPolicy Forbid)",
                    st.run
                ),
            ));
        }
    }
    d
}

/// The status a new run starts from: what belongs to the Transfer (conditions, history, the
/// schedule's figures) kept, what belongs to a run reset. A replaced run is recorded first.
pub fn begin(t: &Transfer, before: &TransferStatus, d: &Decision, now: &Time) -> TransferStatus {
    let mut history = before.history.clone();
    if d.replace {
        let mut replaced = before.clone();
        replaced.completion_time = Some(now.clone());
        push_record(
            &mut history,
            record(&replaced, RunResult::Replaced),
            history_limit(t),
        );
    }
    let start = d.start.unwrap_or(Start::Triggered);
    let (cause, scheduled_time) = match start {
        Start::Created => (RunCause::Created, None),
        Start::Triggered => (RunCause::Triggered, None),
        Start::Scheduled(at) => (RunCause::Scheduled, Some(Time(at))),
    };
    TransferStatus {
        run: before.run + 1,
        attempts: 1,
        observed_trigger: t.spec.trigger.clone(),
        observed_generation: t.metadata.generation,
        conditions: before.conditions.clone(),
        started_by: Some(RunStart {
            cause,
            scheduled_time: scheduled_time.clone(),
        }),
        last_schedule_time: scheduled_time
            .or(d.served.map(Time))
            .or_else(|| before.last_schedule_time.clone()),
        last_success_time: before.last_success_time.clone(),
        skipped_runs: before.skipped_runs,
        history,
        ..TransferStatus::default()
    }
}

/// The Event for a run that starts (none for the first).
pub fn start_note(d: &Decision, run: u32) -> Option<Note> {
    let message = match d.start? {
        Start::Created => return None,
        Start::Triggered => format!("spec.trigger changed: run {run} starts"),
        Start::Scheduled(at) => {
            let mut m = format!("the schedule fired at {at}: run {run} starts");
            if let Some(first) = d.missed_since {
                m.push_str(&format!(
                    " (the times since {first} passed with no run; this one run catches them up)"
                ));
            }
            if d.replace {
                m.push_str(&format!(
                    "; run {} gives way (concurrencyPolicy Replace)",
                    run - 1
                ));
            }
            m
        }
    };
    Some(Note {
        warning: false,
        reason: if matches!(d.start, Some(Start::Scheduled(_))) {
            "Scheduled"
        } else {
            "Triggered"
        },
        message,
    })
}

/// Counts a skipped scheduled time into the status, with its Event.
pub fn skip(st: &mut TransferStatus, at: Timestamp, why: &str) -> Note {
    st.last_schedule_time = Some(Time(at));
    st.skipped_runs += 1;
    Note {
        warning: true,
        reason: "RunSkipped",
        message: format!("scheduled run skipped: {why}"),
    }
}

/// After a plan: a run that just finished goes into the history (and a success into
/// `lastSuccessTime`), and a scheduled Transfer shows its next run.
pub fn after_plan(t: &Transfer, before: &TransferStatus, st: &mut TransferStatus, d: &Decision) {
    let just_finished =
        st.phase.is_finished() && (!before.phase.is_finished() || before.run != st.run);
    if just_finished {
        let result = if st.phase == Phase::Succeeded {
            st.last_success_time = st.completion_time.clone();
            RunResult::Succeeded
        } else {
            RunResult::Failed
        };
        let r = record(st, result);
        push_record(&mut st.history, r, history_limit(t));
    }
    st.next_run_time = d.next.map(Time);
}

fn history_limit(t: &Transfer) -> usize {
    t.spec.history_limit.unwrap_or(DEFAULT_HISTORY_LIMIT) as usize
}

fn push_record(history: &mut Vec<RunRecord>, r: RunRecord, limit: usize) {
    history.retain(|h| h.run != r.run);
    history.insert(0, r);
    history.truncate(limit);
}

fn record(st: &TransferStatus, result: RunResult) -> RunRecord {
    let started = st.started_by.clone().unwrap_or_default();
    let progress = st.progress.clone().unwrap_or_default();
    let wire = st.wire.clone().unwrap_or_default();
    RunRecord {
        run: st.run,
        cause: started.cause,
        scheduled_time: started.scheduled_time,
        start_time: st.start_time.clone(),
        completion_time: st.completion_time.clone(),
        result,
        files: progress.files_done,
        bytes: progress.bytes_done,
        wire_bytes: wire.bytes,
        dedup_bytes: wire.dedup_bytes,
        attempts: st.attempts,
        message: match result {
            RunResult::Succeeded => None,
            _ => st
                .last_error
                .as_ref()
                .map(|e| format!("{}: {}", e.reason, e.message)),
        },
    }
}

#[cfg(test)]
mod tests;
