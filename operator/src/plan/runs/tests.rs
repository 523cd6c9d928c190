use super::*;
use crate::api::{Endpoint, HostPathEndpoint, TransferSpec};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn scheduled(cron: &str) -> Transfer {
    let ep = |node: &str| Endpoint {
        host_path: Some(HostPathEndpoint {
            node: node.into(),
            path: "/data/x".into(),
            ..HostPathEndpoint::default()
        }),
        ..Endpoint::default()
    };
    let mut t = Transfer::new(
        "nightly",
        TransferSpec {
            source: ep("node-a"),
            destination: ep("node-b"),
            streams: None,
            compression: None,
            dedup: true,
            checksum: false,
            delete_extraneous: false,
            exclude: vec![],
            preserve_ownership: false,
            read_all_files: false,
            on_unreadable: Default::default(),
            bandwidth_limit: None,
            sync: false,
            backoff_limit: 3,
            active_deadline_seconds: None,
            ttl_seconds_after_finished: None,
            suspend: false,
            trigger: None,
            schedule: Some(ScheduleSpec {
                cron: cron.into(),
                ..ScheduleSpec::default()
            }),
            history_limit: None,
            mover: None,
        },
    );
    t.metadata.creation_timestamp = Some(Time(ts("2026-11-27T10:00:30Z")));
    t
}

/// The status after run 1 finished with `phase`, last acting on the schedule at `last`.
fn after_run(phase: Phase, last: Option<&str>) -> TransferStatus {
    TransferStatus {
        run: 1,
        attempts: 1,
        phase,
        last_schedule_time: last.map(|l| Time(ts(l))),
        ..TransferStatus::default()
    }
}

#[test]
fn the_first_run_starts_at_creation_and_the_schedule_names_the_next() {
    let t = scheduled("*/5 * * * *");
    let d = decide(&t, &TransferStatus::default(), ts("2026-11-27T10:00:31Z"));
    assert_eq!(d.start, Some(Start::Created));
    assert_eq!(d.next, Some(ts("2026-11-27T10:05:00Z")));
    assert!(d.skip.is_none() && !d.replace);
}

#[test]
fn a_finished_transfer_runs_when_the_schedule_fires() {
    let t = scheduled("*/5 * * * *");
    let st = after_run(Phase::Succeeded, None);
    let d = decide(&t, &st, ts("2026-11-27T10:04:59Z"));
    assert_eq!(d.start, None, "not yet");
    assert_eq!(d.next, Some(ts("2026-11-27T10:05:00Z")));
    let d = decide(&t, &st, ts("2026-11-27T10:05:00Z"));
    assert_eq!(d.start, Some(Start::Scheduled(ts("2026-11-27T10:05:00Z"))));
    assert_eq!(d.next, Some(ts("2026-11-27T10:10:00Z")));
    // A failed run does not stop the schedule.
    let d = decide(
        &t,
        &after_run(Phase::Failed, None),
        ts("2026-11-27T10:05:01Z"),
    );
    assert!(matches!(d.start, Some(Start::Scheduled(_))));
}

#[test]
fn the_new_run_keeps_what_belongs_to_the_transfer() {
    let t = scheduled("*/5 * * * *");
    let mut st = after_run(Phase::Succeeded, Some("2026-11-27T10:00:00Z"));
    st.history = vec![RunRecord {
        run: 1,
        ..RunRecord::default()
    }];
    st.skipped_runs = 2;
    st.last_success_time = Some(Time(ts("2026-11-27T10:01:00Z")));
    st.digest = Some("d".into());
    let now = ts("2026-11-27T10:05:02Z");
    let d = decide(&t, &st, now);
    let new = begin(&t, &st, &d, &Time(now));
    assert_eq!((new.run, new.attempts), (2, 1));
    assert_eq!(new.history, st.history);
    assert_eq!(new.skipped_runs, 2);
    assert_eq!(new.last_success_time, st.last_success_time);
    assert_eq!(
        new.last_schedule_time,
        Some(Time(ts("2026-11-27T10:05:00Z")))
    );
    assert_eq!(new.digest, None, "the run's own figures start afresh");
    let by = new.started_by.unwrap();
    assert_eq!(by.cause, RunCause::Scheduled);
    assert_eq!(by.scheduled_time, Some(Time(ts("2026-11-27T10:05:00Z"))));
}

#[test]
fn forbid_skips_a_time_that_comes_while_a_run_is_going_and_counts_it() {
    let t = scheduled("*/5 * * * *");
    let mut st = after_run(Phase::Running, None);
    let now = ts("2026-11-27T10:05:01Z");
    let d = decide(&t, &st, now);
    assert_eq!(d.start, None);
    let (at, why) = d.skip.clone().unwrap();
    assert_eq!(at, ts("2026-11-27T10:05:00Z"));
    assert!(why.contains("run 1 was still going"), "{why}");
    let note = skip(&mut st, at, &why);
    assert_eq!(note.reason, "RunSkipped");
    assert_eq!(st.skipped_runs, 1);
    // Acted on: the same time is not skipped twice.
    let d = decide(&t, &st, ts("2026-11-27T10:06:00Z"));
    assert_eq!(d.skip, None);
    assert_eq!(d.start, None);
}

#[test]
fn replace_starts_the_due_run_and_records_the_one_it_replaces() {
    let mut t = scheduled("*/5 * * * *");
    t.spec.schedule.as_mut().unwrap().concurrency_policy = ConcurrencyPolicy::Replace;
    let st = after_run(Phase::Running, None);
    let now = ts("2026-11-27T10:05:01Z");
    let d = decide(&t, &st, now);
    assert!(d.replace);
    let new = begin(&t, &st, &d, &Time(now));
    assert_eq!(new.run, 2);
    assert_eq!(new.history.len(), 1);
    assert_eq!(new.history[0].run, 1);
    assert_eq!(new.history[0].result, RunResult::Replaced);
    assert_eq!(new.history[0].completion_time, Some(Time(now)));
}

#[test]
fn times_missed_while_nothing_ran_get_one_catch_up_run_for_the_latest() {
    let t = scheduled("* * * * *");
    // The operator was away for three hours: 180 times passed, one run catches up.
    let st = after_run(Phase::Succeeded, Some("2026-11-27T10:01:00Z"));
    let now = ts("2026-11-27T13:01:30Z");
    let d = decide(&t, &st, now);
    assert_eq!(d.start, Some(Start::Scheduled(ts("2026-11-27T13:01:00Z"))));
    let note = start_note(&d, 2).unwrap();
    assert!(
        note.message
            .contains("the times since 2026-11-27T10:02:00Z passed with no run"),
        "{}",
        note.message
    );
    // A daily schedule missed for two days catches up its latest day only.
    let t = scheduled("0 2 * * *");
    let st = after_run(Phase::Succeeded, Some("2026-11-25T02:00:00Z"));
    let d = decide(&t, &st, ts("2026-11-27T12:00:00Z"));
    assert_eq!(d.start, Some(Start::Scheduled(ts("2026-11-27T02:00:00Z"))));
}

#[test]
fn a_time_past_its_starting_deadline_is_skipped_not_run() {
    let mut t = scheduled("0 2 * * *");
    t.spec.schedule.as_mut().unwrap().starting_deadline_seconds = Some(600);
    let st = after_run(Phase::Succeeded, Some("2026-11-26T02:00:00Z"));
    let d = decide(&t, &st, ts("2026-11-27T02:09:00Z"));
    assert_eq!(d.start, Some(Start::Scheduled(ts("2026-11-27T02:00:00Z"))));
    let d = decide(&t, &st, ts("2026-11-27T02:11:00Z"));
    assert_eq!(d.start, None);
    let (at, why) = d.skip.unwrap();
    assert_eq!(at, ts("2026-11-27T02:00:00Z"));
    assert!(why.contains("startingDeadlineSeconds (600 s)"), "{why}");
    assert_eq!(d.next, Some(ts("2026-11-28T02:00:00Z")));
}

#[test]
fn a_suspended_schedule_fires_nothing_and_catches_up_once_after() {
    let mut t = scheduled("* * * * *");
    t.spec.suspend = true;
    let st = after_run(Phase::Succeeded, Some("2026-11-27T10:01:00Z"));
    let d = decide(&t, &st, ts("2026-11-27T10:30:00Z"));
    assert_eq!(d, Decision::default());
    t.spec.suspend = false;
    let d = decide(&t, &st, ts("2026-11-27T10:30:00Z"));
    assert_eq!(d.start, Some(Start::Scheduled(ts("2026-11-27T10:30:00Z"))));
}

#[test]
fn a_trigger_still_runs_a_scheduled_transfer_and_serves_the_due_time() {
    let mut t = scheduled("0 2 * * *");
    t.spec.trigger = Some("now".into());
    let st = after_run(Phase::Succeeded, Some("2026-11-26T02:00:00Z"));
    let now = ts("2026-11-27T12:00:00Z");
    let d = decide(&t, &st, now);
    assert_eq!(d.start, Some(Start::Triggered));
    assert_eq!(d.skip, None);
    // Once that run finished, the 02:00 it served starts no second run.
    let mut after = begin(&t, &st, &d, &Time(now));
    assert_eq!(
        after.last_schedule_time,
        Some(Time(ts("2026-11-27T02:00:00Z")))
    );
    after.phase = Phase::Succeeded;
    let d = decide(&t, &after, ts("2026-11-27T12:30:00Z"));
    assert_eq!(d.start, None);
    assert_eq!(d.next, Some(ts("2026-11-28T02:00:00Z")));
}

#[test]
fn an_invalid_schedule_starts_nothing_by_itself() {
    let mut t = scheduled("0 2 * * *");
    t.spec.schedule.as_mut().unwrap().time_zone = Some("Mars/Olympus_Mons".into());
    let err = Schedule::parse(t.spec.schedule.as_ref().unwrap()).unwrap_err();
    assert!(
        err.contains("spec.schedule.timeZone: \"Mars/Olympus_Mons\" is not a time zone"),
        "{err}"
    );
    let d = decide(
        &t,
        &after_run(Phase::Succeeded, None),
        ts("2026-11-28T12:00:00Z"),
    );
    assert_eq!(d, Decision::default());
    let err = Schedule::parse(&ScheduleSpec {
        cron: "0 0 31 4 *".into(),
        ..ScheduleSpec::default()
    })
    .unwrap_err();
    assert!(err.contains("never comes"), "{err}");
}

#[test]
fn a_finished_run_goes_into_the_history_newest_first_within_the_limit() {
    let mut t = scheduled("* * * * *");
    t.spec.history_limit = Some(2);
    let mut st = TransferStatus::default();
    for run in 1..=3u32 {
        let before = TransferStatus {
            run,
            phase: Phase::Running,
            ..st.clone()
        };
        st = before.clone();
        st.phase = if run == 2 {
            Phase::Failed
        } else {
            Phase::Succeeded
        };
        st.completion_time = Some(Time(ts("2026-11-27T10:00:00Z")));
        st.last_error = (run == 2).then(|| crate::api::LastError {
            reason: "MoverFailed".into(),
            message: "disk full".into(),
        });
        after_plan(&t, &before, &mut st, &Decision::default());
        // Looked at again, a finished run is not recorded twice.
        let again = st.clone();
        after_plan(&t, &again, &mut st, &Decision::default());
    }
    let runs: Vec<(u32, RunResult)> = st.history.iter().map(|h| (h.run, h.result)).collect();
    assert_eq!(
        runs,
        vec![(3, RunResult::Succeeded), (2, RunResult::Failed)]
    );
    assert_eq!(
        st.history[1].message.as_deref(),
        Some("MoverFailed: disk full")
    );
    assert_eq!(st.last_success_time, st.completion_time);
}

#[test]
fn the_latest_firing_search_is_bounded_by_the_last_one_acted_on() {
    let s = Schedule::parse(&ScheduleSpec {
        cron: "*/10 * * * *".into(),
        ..ScheduleSpec::default()
    })
    .unwrap();
    let now = ts("2026-11-27T10:25:00Z");
    assert_eq!(s.latest(ts("2026-11-27T10:20:00Z"), now), None);
    assert_eq!(
        s.latest(ts("2026-11-27T10:19:59Z"), now),
        Some(ts("2026-11-27T10:20:00Z"))
    );
    assert_eq!(
        s.latest(ts("2020-01-01T00:00:00Z"), now),
        Some(ts("2026-11-27T10:20:00Z"))
    );
}

#[test]
fn a_schedule_added_later_counts_from_the_last_runs_start() {
    let mut t = scheduled("0 2 * * *");
    // Created long ago, its last run started yesterday at 12:00.
    t.metadata.creation_timestamp = Some(Time(ts("2026-01-01T00:00:00Z")));
    let mut st = after_run(Phase::Succeeded, None);
    st.start_time = Some(Time(ts("2026-11-26T12:00:00Z")));
    let d = decide(&t, &st, ts("2026-11-27T09:00:00Z"));
    assert_eq!(d.start, Some(Start::Scheduled(ts("2026-11-27T02:00:00Z"))));
    // A run that started after the last scheduled time is current.
    st.start_time = Some(Time(ts("2026-11-27T03:00:00Z")));
    let d = decide(&t, &st, ts("2026-11-27T09:00:00Z"));
    assert_eq!(d.start, None);
}
