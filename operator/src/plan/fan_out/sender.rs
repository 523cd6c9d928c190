//! The fan-out's sender: one pod on the source node for the first attempts of a run's
//! children. It sends to every child's receiver at once, one session each acting as that child
//! (its certificate names each), and reads every full block of the source once for all of
//! them. The children's receivers are gathered first: it starts once each child waiting for it
//! has a ready receiver, or [`GATHER`] after the first receiver was ready, with those that are.
//! A child it does not serve (late, queued by the concurrency limits, or retrying) runs a sender
//! of its own. Pure.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::plan::until;

/// One destination of a fan-out's sender: the child's transfer id (`<uid>.<run>`, which the
/// sender's certificate names for the child's first attempt) and its receiver's pod IP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub transfer_id: String,
    pub ip: String,
}

/// Most destinations one sender pod serves: each session adds about 25 MiB to a sender's
/// resident memory at 4 streams and 35 MiB at 16 (8 destinations: 242 MiB at 4 streams, 360-470
/// MiB at 16, against the default limit of 512 MiB). More destinations get more senders, each
/// reading the source once for its own.
pub const MAX_SERVED: usize = 8;
/// What one sender's memory is budgeted at: one destination, at any stream count (219 MiB
/// measured at 16 streams), then each further destination.
const FIRST_SESSION: u64 = 224 << 20;
const NEXT_SESSION: u64 = 32 << 20;

/// How many destinations one sender serves under the movers' memory limit (none: no limit).
pub fn served_per_sender(memory_limit: Option<u64>) -> usize {
    match memory_limit {
        None => MAX_SERVED,
        Some(limit) => {
            let more = limit.saturating_sub(FIRST_SESSION) / NEXT_SESSION;
            usize::try_from(more).map_or(MAX_SERVED, |m| (m + 1).min(MAX_SERVED))
        }
    }
}

/// How long the fan-out waits for the slowest receivers once the first is ready.
pub const GATHER: Duration = Duration::from_secs(20);
/// How often it looks again while gathering (its children's receivers are not watched).
const GATHERING: Duration = Duration::from_secs(2);

/// A child of the current run, as the fan-out's sender sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// `<child uid>.<child run>`: what its movers' certificates name.
    pub transfer_id: String,
    /// Its first attempt runs (not queued by the limits) and has no sender yet (neither this
    /// one nor its own).
    pub waiting: bool,
    /// Its receiver once ready: the pod IP, and when the pod was created.
    pub receiver: Option<(String, Timestamp)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SenderStep {
    /// Nothing to do: it runs already, or no child waits for it.
    Idle,
    /// Gathering receivers: look again after this long.
    Wait(Duration),
    /// Start it for these destinations.
    Start(Vec<Served>),
}

/// What to do about the run's sender, given the run's `destinations` (how many children it
/// has), its children as observed and whether the sender exists.
pub fn step(
    candidates: &[Candidate],
    destinations: usize,
    exists: bool,
    now: Timestamp,
) -> SenderStep {
    if exists {
        return SenderStep::Idle;
    }
    let waiting: Vec<&Candidate> = candidates.iter().filter(|c| c.waiting).collect();
    let ready: Vec<(&Candidate, &str, Timestamp)> = waiting
        .iter()
        .filter_map(|c| c.receiver.as_ref().map(|(ip, at)| (*c, ip.as_str(), *at)))
        .collect();
    let Some(first_ready) = ready.iter().map(|(_, _, at)| *at).min() else {
        return if waiting.is_empty() {
            SenderStep::Idle
        } else {
            SenderStep::Wait(GATHERING)
        };
    };
    // Every destination's child is there, and each that waits is ready.
    let everyone = candidates.len() == destinations && ready.len() == waiting.len();
    let gathered = until(first_ready, now) >= GATHER;
    if everyone || gathered {
        SenderStep::Start(
            ready
                .into_iter()
                .map(|(c, ip, _)| Served {
                    transfer_id: c.transfer_id.clone(),
                    ip: ip.to_owned(),
                })
                .collect(),
        )
    } else {
        SenderStep::Wait((GATHER - until(first_ready, now)).min(GATHERING))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn child(id: &str, waiting: bool, ready_at: Option<i64>) -> Candidate {
        Candidate {
            transfer_id: id.into(),
            waiting,
            receiver: ready_at.map(|s| (format!("10.0.0.{}", id.len()), at(s))),
        }
    }

    fn served(step: &SenderStep) -> Vec<&str> {
        match step {
            SenderStep::Start(s) => s.iter().map(|s| s.transfer_id.as_str()).collect(),
            other => panic!("not started: {other:?}"),
        }
    }

    #[test]
    fn a_memory_limit_bounds_the_destinations_of_one_sender() {
        assert_eq!(served_per_sender(None), MAX_SERVED);
        assert_eq!(served_per_sender(Some(512 << 20)), MAX_SERVED);
        assert_eq!(served_per_sender(Some(256 << 20)), 2);
        assert_eq!(served_per_sender(Some(128 << 20)), 1);
        assert_eq!(served_per_sender(Some(u64::MAX)), MAX_SERVED);
    }

    #[test]
    fn it_starts_as_soon_as_every_destination_is_ready() {
        let all = [child("a.1", true, Some(0)), child("bb.1", true, Some(3))];
        assert_eq!(served(&step(&all, 2, false, at(4))), ["a.1", "bb.1"]);
        // It exists: nothing more, whatever the children do.
        assert_eq!(step(&all, 2, true, at(4)), SenderStep::Idle);
    }

    #[test]
    fn it_gathers_the_slow_receivers_for_a_while_then_goes_without_them() {
        let some = [child("a.1", true, Some(0)), child("bb.1", true, None)];
        assert_eq!(step(&some, 2, false, at(5)), SenderStep::Wait(GATHERING));
        assert_eq!(
            step(&some, 2, false, at(19)),
            SenderStep::Wait(Duration::from_secs(1))
        );
        assert_eq!(served(&step(&some, 2, false, at(20))), ["a.1"]);
        // A child not created yet (admission) counts as not ready.
        let one = [child("a.1", true, Some(0))];
        assert!(matches!(step(&one, 2, false, at(5)), SenderStep::Wait(_)));
    }

    #[test]
    fn children_that_do_not_wait_are_left_to_their_own_senders() {
        // A retrying child, one with a sender of its own or one the limits keep queued: not
        // served, and not waited for.
        let mixed = [child("a.1", true, Some(0)), child("bb.1", false, Some(0))];
        assert_eq!(served(&step(&mixed, 2, false, at(1))), ["a.1"]);
        let queued = [child("a.1", true, Some(0)), child("bb.1", false, None)];
        assert_eq!(served(&step(&queued, 2, false, at(1))), ["a.1"]);
        let none = [child("a.1", false, Some(0))];
        assert_eq!(step(&none, 1, false, at(30)), SenderStep::Idle);
        // Waiting, none ready: look again soon.
        let unready = [child("a.1", true, None)];
        assert_eq!(
            step(&unready, 1, false, at(30)),
            SenderStep::Wait(GATHERING)
        );
    }
}
