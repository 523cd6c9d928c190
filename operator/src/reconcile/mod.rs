//! The wiring: the controller loop, one reconcile as observe -> plan -> apply -> status, the error
//! policy by category, the finalizer, and shutdown. Every decision is the plan's (`crate::plan`);
//! what is read is the observer's (`crate::observe`), what is written the applier's
//! (`crate::apply`) and the status writer's (`crate::status`).

mod fan_out;
mod finalizer;
mod tail;

pub use crate::context::{Context, Error};

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::{Action as Requeue, Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use crate::api::{Phase, Reason, Transfer, TransferStatus};
use crate::apply::apply;
use crate::cache::{self, OwnWrites, SecretBook};
use crate::census;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::names::{FINALIZER, MANAGER};
use crate::observe::{limits_of, observe};
use crate::peering::client::PeerClient;
use crate::peering::registry::Registry;
use crate::pki::Authority;
use crate::plan;
use crate::progress::Watchers;
use crate::status::{Written, record, write_status};
use finalizer::{cleanup, set_finalizer};
use tail::{STALE_RETRY, conclude};

/// Reconciles at once: paces the storm of a start (every Transfer is looked at once) so the
/// status writes it causes spread out.
const RECONCILE_CONCURRENCY: u16 = 16;

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let authority = Arc::new(
        Authority::load_or_create(
            client.clone(),
            &config.namespace,
            &config.cluster_name,
            config.cert_days,
        )
        .await?,
    );
    if config.block_service.is_some() {
        crate::node_service::spawn_keeper(
            client.clone(),
            config.namespace.clone(),
            authority.clone(),
            config.cert_days,
        );
    }
    if config.node_store_volumes {
        crate::store_volumes::spawn_keeper(client.clone(), config.namespace.clone());
    }
    let (wake_tx, mut wake_rx) = mpsc::channel::<ObjectRef<Transfer>>(1024);
    let (caches, triggers) = cache::start(&client, &config.namespace);
    let peers = caches.peers.clone();
    let registry = Arc::new(Registry::default());
    if let Some(addr) = config.peering_listen {
        let tls = crate::peering::server::tls_config(authority.clone(), peers.clone())?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(addr = %listener.local_addr()?, "cross-cluster API listening");
        let state = Arc::new(crate::peering::server::ApiState::new(
            caches.transfers.clone(),
            peers.clone(),
            registry.clone(),
            wake_tx.clone(),
            authority.cluster().to_owned(),
        ));
        tokio::spawn(async move {
            if let Err(e) = crate::peering::server::serve(listener, tls, state).await {
                tracing::error!("cross-cluster API stopped: {e}");
            }
        });
        crate::peering::leader::mark_own_pod(&client, &config.namespace, true).await;
    }
    // Nothing is planned from a cache that has not listed once.
    caches.synced().await;
    tracing::info!("caches synced");
    let wake = futures::stream::poll_fn(move |cx| wake_rx.poll_recv(cx));
    // A child's change wakes its fan-out once the cache holds it (the reflector stored the
    // event before this sees it). A wake sent when the child's status was written would find
    // the cache a version behind, and the fan-out would report the child only at its periodic
    // look (RESYNC_RUNNING, 15 s), well after the child succeeded. A full queue only delays
    // that to the periodic look.
    let parent_wake = wake_tx.clone();
    let transfer_events = triggers.transfers.inspect(move |event| {
        if let Ok(t) = event
            && let Some(parent) = crate::plan::fan_out::parent_of(t)
        {
            let _ = parent_wake.try_send(parent);
        }
    });
    let controller = Controller::for_stream(transfer_events, caches.transfers.clone())
        .owns_stream(triggers.pods)
        .with_config(ControllerConfig::default().concurrency(RECONCILE_CONCURRENCY))
        .reconcile_on(wake)
        .graceful_shutdown_on(shutdown);
    let reporter = Reporter {
        controller: MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let limiter = Arc::new(crate::status::PatchLimiter::new(config.status_patch_qps));
    let watchers = Watchers::new(
        wake_tx.clone(),
        config.max_progress_watchers,
        limiter.clone(),
    );
    census::spawn(
        caches.transfers.clone(),
        limits_of(&config),
        limiter.clone(),
        metrics.clone(),
        wake_tx.clone(),
    );
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        store: caches.transfers.clone(),
        client,
        config,
        peer_client: PeerClient::new(authority.clone()),
        authority,
        peers,
        registry,
        watchers,
        metrics: metrics.clone(),
        limiter,
        caches,
        secrets: SecretBook::default(),
        own_writes: OwnWrites::default(),
        acting_since: Timestamp::now(),
        failing: Default::default(),
    });
    metrics.set_ready(true);
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("reconcile: {e}");
            }
        })
        .await;
    Ok(())
}

fn error_policy(t: Arc<Transfer>, e: &Error, ctx: Arc<Context>) -> Requeue {
    ctx.metrics.reconcile_error(e.category());
    let uid = t.uid().unwrap_or_default();
    let consecutive = {
        let mut m = ctx.failing.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(uid).or_default();
        *n = n.saturating_add(1);
        *n
    };
    let wait = retry_after(e, consecutive);
    tracing::warn!(
        transfer = %t.name_any(),
        category = e.category(),
        consecutive,
        retry_in = ?wait,
        "reconcile failed: {e}"
    );
    Requeue::requeue(wait)
}

/// How long after a failed reconcile a Transfer is looked at again, doubling with each
/// failure in a row: an API error (a timeout, a 5xx, a 429, a conflict) is usually over soon;
/// certificates fail for a cause an admin must fix; a malformed object stays malformed until it
/// is edited (which wakes a reconcile anyway).
pub fn retry_after(e: &Error, consecutive: u32) -> Duration {
    let (first, most) = match e {
        Error::Api(_) => (Duration::from_secs(1), Duration::from_secs(60)),
        Error::Pki(_) => (Duration::from_secs(30), Duration::from_secs(600)),
        Error::Malformed(_) => (Duration::from_secs(300), Duration::from_secs(300)),
    };
    let doublings = consecutive.saturating_sub(1).min(16);
    (first * (1u32 << doublings)).min(most)
}

/// One reconcile of one Transfer, timed.
pub async fn reconcile(cached: Arc<Transfer>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let started = std::time::Instant::now();
    let uid = cached.uid();
    let result = reconcile_once(cached, &ctx).await;
    ctx.metrics.reconcile_duration(started.elapsed());
    if result.is_ok()
        && let Some(uid) = uid
    {
        ctx.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uid);
    }
    result
}

async fn reconcile_once(cached: Arc<Transfer>, ctx: &Arc<Context>) -> Result<Requeue, Error> {
    ctx.metrics.reconcile();
    // The Transfer store is ready before the first reconcile; the pod store fills alongside,
    // and a plan without the pods would take running movers for lost ones. Not awaited: the
    // pod watch is driven by the controller itself, which polls it only while a reconcile slot
    // is free, so reconciles waiting for it could hold every slot.
    if !ctx.caches.pods_synced() {
        return Ok(Requeue::requeue(Duration::from_secs(1)));
    }
    if ctx.own_writes.is_stale(&cached) {
        // Our own write's watch event wakes the reconcile that sees it; this is the fallback.
        return Ok(Requeue::requeue(STALE_RETRY));
    }
    let t = cached.as_ref();
    if t.metadata.deletion_timestamp.is_some() {
        return cleanup(t, ctx).await;
    }
    if !t.finalizers().iter().any(|f| f == FINALIZER) {
        // The finalizer is there before anything is written, so a deletion always cleans up.
        set_finalizer(t, ctx, true).await?;
        return Ok(Requeue::requeue(Duration::ZERO));
    }
    if t.is_fan_out() {
        return fan_out::reconcile(t, ctx).await;
    }
    let obs = observe(t, ctx).await?;
    let mut plan = plan::plan(t, &obs);
    log_failure(t, &obs, &plan.status);
    if let Err(e) = apply(t, ctx, &obs, &plan).await {
        // A change the API server refuses for good (admission: quota, LimitRange, Pod Security,
        // a missing priority class; an invalid object) is the Transfer's news, not only the
        // log's: it becomes its condition and an Event, and is tried again with backoff.
        let Some(message) = refused(&e) else {
            return Err(e);
        };
        let message = format!("the API server refused a change for this Transfer: {message}");
        let repeated = t.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == Reason::MoverRejected.as_str())
        });
        plan.status.phase = Phase::Pending;
        plan::set_refused(&mut plan.status, &message, t.metadata.generation);
        if matches!(write_status(t, ctx, &plan.status).await?, Written::Stale) {
            return Ok(Requeue::requeue(STALE_RETRY));
        }
        if !repeated {
            record(
                t,
                ctx,
                &[plan::Note {
                    warning: true,
                    reason: Reason::MoverRejected.as_str(),
                    message,
                }],
            )
            .await;
        }
        // Quota frees up, an admin fixes a policy: look again, less often while it repeats.
        return Ok(Requeue::requeue(if repeated {
            REFUSED_RETRY_MAX
        } else {
            REFUSED_RETRY_FIRST
        }));
    }
    conclude(t, ctx, &plan.status, &plan.notes, plan.requeue).await
}

/// When a refused change is tried again: soon after the first refusal, then every minute.
const REFUSED_RETRY_FIRST: Duration = Duration::from_secs(10);
const REFUSED_RETRY_MAX: Duration = Duration::from_secs(60);

/// The API server's message when it refused a change for good (a 4xx other than a conflict or a
/// missing object, which the next reconcile sorts out by itself).
fn refused(e: &Error) -> Option<String> {
    match e {
        Error::Api(kube::Error::Api(ae)) if matches!(ae.code, 400 | 403 | 422) => {
            Some(ae.message.clone())
        }
        _ => None,
    }
}

/// An attempt that just failed, with what each mover pod showed: the operator's log is where an
/// admin looks first, and the Transfer's message keeps only the movers' words.
fn log_failure(t: &Transfer, obs: &plan::Observed, next: &TransferStatus) {
    let before = t.status.as_ref().map(|s| s.failures).unwrap_or(0);
    if next.failures <= before {
        return;
    }
    let pods: Vec<String> = obs
        .pods
        .iter()
        .map(|p| format!("{} {:?} exit {:?}", p.name, p.phase, p.exit_code))
        .collect();
    tracing::info!(
        transfer = %format!("{}/{}", t.namespace().unwrap_or_default(), t.name_any()),
        phase = ?next.phase,
        attempt = next.attempts,
        pods = %pods.join(", "),
        "attempt failed: {}",
        next.last_error.as_ref().map(|e| e.message.as_str()).unwrap_or("")
    );
}

#[cfg(test)]
mod tests {
    use super::{Error, retry_after};
    use std::time::Duration;

    #[test]
    fn failed_reconciles_back_off_by_category() {
        let api = Error::Api(kube::Error::LinesCodecMaxLineLengthExceeded);
        assert_eq!(retry_after(&api, 1), Duration::from_secs(1));
        assert_eq!(retry_after(&api, 4), Duration::from_secs(8));
        assert_eq!(retry_after(&api, 40), Duration::from_secs(60));
        let invalid = Error::Malformed("namespace");
        assert_eq!(retry_after(&invalid, 1), Duration::from_secs(300));
        assert_eq!(retry_after(&invalid, 9), Duration::from_secs(300));
    }
}
