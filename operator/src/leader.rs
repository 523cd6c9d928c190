//! Leader election on a `coordination.k8s.io` Lease: one replica reconciles, the others wait.
//!
//! The holder renews every [`RENEW`]; a Lease not renewed for its duration may be taken over.
//! Every write carries the resourceVersion read just before, so two candidates cannot both win.
//! A holder that cannot renew in time stops (its Deployment restarts it as a candidate).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// How long a Lease stays valid without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews, and a candidate retries.
pub const RENEW: Duration = Duration::from_secs(4);

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
}

/// What a candidate decides from the Lease it read (pure, unit-tested).
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Ours already: renew it.
    Renew,
    /// Free or expired: take it.
    Take,
    /// Someone else holds it.
    Wait,
}

pub fn decide(lease: &Lease, me: &str, now: Timestamp) -> Decision {
    let spec = lease.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() == Some(me) {
        return Decision::Renew;
    }
    let Some(holder) = spec.holder_identity.filter(|h| !h.is_empty()) else {
        return Decision::Take;
    };
    let _ = holder;
    let duration = spec
        .lease_duration_seconds
        .map_or(LEASE_DURATION.as_secs() as i64, i64::from);
    let renewed = spec
        .renew_time
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH);
    if renewed.as_second() + duration < now.as_second() {
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
        }
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&self) -> Result<(), kube::Error> {
        let mut announced = false;
        loop {
            if self.try_hold().await? {
                tracing::info!(lease = %self.name, identity = %self.identity, "leading");
                return Ok(());
            }
            if !announced {
                tracing::info!(lease = %self.name, "another replica leads; waiting");
                announced = true;
            }
            tokio::time::sleep(RENEW).await;
        }
    }

    /// Renews until a renewal fails for longer than the Lease lasts; then returns.
    pub async fn hold(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(RENEW).await;
            match self.try_hold().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(lease = %self.name, "leadership taken over");
                    return;
                }
                Err(e) => tracing::warn!(lease = %self.name, "failed to renew: {e}"),
            }
            if last_ok.elapsed() >= LEASE_DURATION - RENEW {
                tracing::error!(lease = %self.name, "could not renew in time");
                return;
            }
        }
    }

    /// Gives the Lease up (on shutdown), so a successor need not wait for it to expire.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await
            && decide(&lease, &self.identity, Timestamp::now()) == Decision::Renew
        {
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
            }
            let _ = self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await;
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
        let decision = decide(&lease, &self.identity, now);
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

    fn lease(holder: Option<&str>, renewed: i64) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).expect("t"))),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_live_lease_of_another_is_respected_an_expired_one_taken() {
        let now = Timestamp::from_second(1000).expect("t");
        assert_eq!(decide(&lease(Some("me"), 999), "me", now), Decision::Renew);
        assert_eq!(decide(&lease(Some("b"), 990), "me", now), Decision::Wait);
        assert_eq!(decide(&lease(Some("b"), 980), "me", now), Decision::Take);
        assert_eq!(decide(&lease(None, 999), "me", now), Decision::Take);
    }
}
