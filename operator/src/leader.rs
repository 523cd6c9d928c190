//! Leader election on a `coordination.k8s.io` Lease: one replica reconciles, the others wait.
//!
//! No clock of another replica is trusted: a candidate takes a Lease over only after it has
//! itself watched the Lease stay unchanged (same resourceVersion) for the Lease's duration, on
//! its own monotonic clock. The holder counts its own deadline from the moment it *sent* its
//! last successful renewal, and stops acting [`RENEW_DEADLINE`] after it, earlier than any
//! candidate can take over (that candidate saw the renewal only after it was sent, and waits
//! the longer [`LEASE_DURATION`]). Each renewal round may take the time left until that
//! deadline and no longer (a slow apiserver still renews; a hung connection cannot keep a
//! holder acting past its deadline). Every write carries the resourceVersion read just before,
//! so two candidates cannot both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::Mutex;
use tokio::time::Instant;

/// How long a Lease stays valid without renewal, as candidates count it.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long after its last successful renewal (counted from when it was sent) a holder stops.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the holder renews, and a candidate looks.
pub const RENEW: Duration = Duration::from_secs(2);
/// The most one candidate's round of reads and writes may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    seen: Mutex<Option<Seen>>,
}

/// The Lease version a candidate last saw, and when it first saw it (its own clock).
#[derive(Debug, Clone)]
struct Seen {
    version: String,
    since: Instant,
}

/// What a candidate decides from the Lease it read (pure, unit-tested).
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Ours already: renew it.
    Renew,
    /// Free, or unchanged for longer than its duration: take it.
    Take,
    /// Someone else holds it.
    Wait,
}

/// `unchanged_for`: how long this candidate has seen the Lease at its current version.
pub fn decide(lease: &Lease, me: &str, unchanged_for: Duration) -> Decision {
    let spec = lease.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() == Some(me) {
        return Decision::Renew;
    }
    if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
        return Decision::Take;
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(LEASE_DURATION, Duration::from_secs);
    if unchanged_for >= duration {
        Decision::Take
    } else {
        Decision::Wait
    }
}

impl Elector {
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            seen: Mutex::new(None),
        }
    }

    /// Waits until this candidate holds the Lease; returns when the winning write was sent.
    pub async fn acquire(&self) -> Instant {
        let mut announced = false;
        loop {
            let sent = Instant::now();
            match tokio::time::timeout(CALL_TIMEOUT, self.try_hold()).await {
                Ok(Ok(true)) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "leading");
                    return sent;
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(lease = %self.name, "reading the Lease: {e}"),
                Err(_) => tracing::warn!(lease = %self.name, "the Lease round timed out"),
            }
            if !announced {
                tracing::info!(lease = %self.name, "another replica leads; waiting");
                announced = true;
            }
            tokio::time::sleep(RENEW).await;
        }
    }

    /// Renews while it can; returns (and the caller stops acting) once the Lease was taken
    /// over, or no renewal succeeded within [`RENEW_DEADLINE`] of the last one being sent
    /// (`acquired`: when the write that won the Lease was sent).
    pub async fn hold(&self, acquired: Instant) {
        let mut last_ok = acquired;
        loop {
            let deadline = last_ok + RENEW_DEADLINE;
            tokio::time::sleep_until((Instant::now() + RENEW).min(deadline)).await;
            let sent = Instant::now();
            if sent >= deadline {
                tracing::error!(lease = %self.name, "could not renew in time; stepping down");
                return;
            }
            match tokio::time::timeout_at(deadline, self.try_hold()).await {
                Ok(Ok(true)) => last_ok = sent,
                Ok(Ok(false)) => {
                    tracing::error!(lease = %self.name, "leadership taken over");
                    return;
                }
                Ok(Err(e)) => tracing::warn!(lease = %self.name, "failed to renew: {e}"),
                Err(_) => tracing::warn!(lease = %self.name, "renewal timed out"),
            }
        }
    }

    /// Gives the Lease up (on shutdown), so a successor need not wait for it to expire.
    pub async fn release(&self) {
        let round = async {
            if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await
                && decide(&lease, &self.identity, Duration::ZERO) == Decision::Renew
            {
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = None;
                }
                let _ = self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await;
            }
        };
        let _ = tokio::time::timeout(CALL_TIMEOUT, round).await;
    }

    /// How long this candidate has seen `lease` at its current version.
    async fn unchanged_for(&self, lease: &Lease) -> Duration {
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let mut seen = self.seen.lock().await;
        match seen.as_ref() {
            Some(s) if s.version == version => s.since.elapsed(),
            _ => {
                *seen = Some(Seen {
                    version,
                    since: Instant::now(),
                });
                Duration::ZERO
            }
        }
    }

    /// One round: true if we hold the Lease afterwards.
    async fn try_hold(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, 0, None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let unchanged_for = self.unchanged_for(&lease).await;
        let decision = decide(&lease, &self.identity, unchanged_for);
        if decision == Decision::Wait {
            return Ok(false);
        }
        let old = lease.spec.clone().unwrap_or_default();
        let transitions =
            old.lease_transitions.unwrap_or(0) + i32::from(decision == Decision::Take);
        let acquired = match decision {
            Decision::Renew => old.acquire_time,
            _ => None,
        };
        // The times written are for people reading the Lease; no replica decides by them.
        lease.spec = Some(self.spec(now, transitions, acquired));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn spec(&self, now: Timestamp, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(15),
                // A holder's clock far ahead or behind decides nothing.
                renew_time: Some(MicroTime(Timestamp::from_second(0).expect("t"))),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_is_taken_only_after_this_candidate_saw_it_unchanged_for_its_duration() {
        let s = Duration::from_secs;
        assert_eq!(decide(&lease(Some("me")), "me", s(0)), Decision::Renew);
        assert_eq!(decide(&lease(Some("b")), "me", s(0)), Decision::Wait);
        assert_eq!(decide(&lease(Some("b")), "me", s(14)), Decision::Wait);
        assert_eq!(decide(&lease(Some("b")), "me", s(15)), Decision::Take);
        assert_eq!(decide(&lease(None), "me", s(0)), Decision::Take);
        assert_eq!(decide(&lease(Some("")), "me", s(0)), Decision::Take);
    }

    #[test]
    fn a_holder_stops_before_any_candidate_may_take_over() {
        // The holder stops RENEW_DEADLINE after sending its last renewal; a candidate that
        // saw that renewal (after it was sent) waits LEASE_DURATION more.
        assert!(RENEW_DEADLINE + RENEW <= LEASE_DURATION);
        assert!(RENEW < RENEW_DEADLINE);
    }
}
