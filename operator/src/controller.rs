//! Wiring: observe -> plan -> apply -> status for each Transfer, the controller loop, the error
//! policy by category, and shutdown.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action as Requeue, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::mpsc;

use crate::api::{Peer, Phase, Reason, Side, Transfer, TransferStatus};
use crate::cache::{self, Caches, OwnWrites, SecretBook};
use crate::census;
use crate::cleanup::{self, CleanupAction};
use crate::config::Config;
use crate::fan_out::SiblingRole;
use crate::limits;
use crate::metrics::Metrics;
use crate::movers::{self, MoverPodInput, RemoteMover};
use crate::names::{self, ANNOTATION_SERVES, FINALIZER, LABEL_FAN_OUT_OF, MANAGER, MoverRole};
use crate::overlap;
use crate::peering::client::PeerClient;
use crate::peering::observe::{observe_remote, withdraw};
use crate::peering::registry::Registry;
use crate::pki::Authority;
use crate::placement::{self, Blocked, SideFacts};
use crate::plan::{self, Action, Observed, PodPhase, PodView, Stuck};
use crate::progress::Watchers;

/// The Pod Security admission label that decides whether hostPath volumes are allowed.
const PSA_ENFORCE: &str = "pod-security.kubernetes.io/enforce";

/// What went wrong in one reconcile, by category (metric label and requeue policy).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("certificates: {0}")]
    Pki(#[from] crate::pki::PkiError),
    #[error("the Transfer has no {0}")]
    Malformed(&'static str),
}

impl Error {
    pub fn category(&self) -> &'static str {
        match self {
            Error::Api(_) => "api",
            Error::Pki(_) => "pki",
            Error::Malformed(_) => "invalid",
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub config: Config,
    pub authority: Arc<Authority>,
    /// The Peers of this cluster (cluster-scoped), kept by a reflector.
    pub peers: kube::runtime::reflector::Store<Peer>,
    /// What the source halves calling this cluster last reported.
    pub registry: Arc<Registry>,
    pub peer_client: PeerClient,
    pub watchers: Watchers,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Transfers the controller knows (for the concurrency limit).
    pub store: kube::runtime::reflector::Store<Transfer>,
    pub limiter: Arc<crate::status::PatchLimiter>,
    /// Everything else reconcile observes.
    pub caches: Caches,
    pub secrets: SecretBook,
    pub own_writes: OwnWrites,
    /// When this operator began to act (it leads): silences of the other cluster are measured
    /// from here at the earliest, since nothing before was heard by this process.
    pub acting_since: Timestamp,
    /// Reconciles that failed in a row, per Transfer UID (the error policy's backoff).
    pub failing: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

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
            && let Some(parent) = crate::fan_out::parent_of(t)
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
        return crate::fan_out::reconcile(t, ctx).await;
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
    let deferred = match write_status(t, ctx, &plan.status).await? {
        Written::Now => None,
        Written::Later(wait) => Some(wait),
        // Planned from a version that changed meanwhile: plan again once the cache has the
        // new one (its watch event wakes the reconcile), and announce nothing of a status
        // that did not land.
        Written::Stale => return Ok(Requeue::requeue(STALE_RETRY)),
    };
    record(t, ctx, &plan.notes).await;
    ctx.metrics.observe(t, &plan.status);
    let requeue = match (plan.requeue, deferred) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(match requeue {
        Some(d) => Requeue::requeue(d.max(Duration::from_millis(200))),
        None => Requeue::await_change(),
    })
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

/// How soon a reconcile that found the cache behind this operator's own write looks again.
const STALE_RETRY: Duration = Duration::from_secs(2);

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

/// Adds or removes our finalizer (a merge patch with the resourceVersion, so a concurrent
/// change of the list is retried rather than overwritten).
///
/// Not kube-runtime's `finalizer` helper: it removes the finalizer as soon as its cleanup
/// callback returns, but ferry's cleanup takes several reconciles (stop the movers, run a
/// cleanup pod on the destination's node, wait for it, give up after 120 s), each requeued
/// while the previous step runs; with the helper every "not done yet" would have to be an
/// error, counted and logged as a failure.
async fn set_finalizer(t: &Transfer, ctx: &Context, present: bool) -> Result<(), Error> {
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ns);
    let mut list: Vec<String> = t
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        list.push(FINALIZER.to_owned());
    }
    let patch = serde_json::json!({
        "metadata": {"finalizers": list, "resourceVersion": t.resource_version()}
    });
    api.patch(
        &t.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    if let Some(uid) = t.uid() {
        ctx.own_writes.wrote(&uid, t.resource_version());
    }
    Ok(())
}

/// A deleted Transfer: stop its movers, remove its staging data, then let it go.
async fn cleanup(t: &Transfer, ctx: &Context) -> Result<Requeue, Error> {
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    ctx.watchers.retain(&pod_prefix(&uid), &[]);
    if !t.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Requeue::await_change());
    }
    let obs = observe(t, ctx).await?;
    let cleaner = names::cleanup_pod_name(&uid);
    let deleting_for = t
        .metadata
        .deletion_timestamp
        .as_ref()
        .and_then(|d| Duration::try_from(Timestamp::now().duration_since(d.0)).ok())
        .unwrap_or_default();
    // Any run that started may have left staging data (an earlier run's, too).
    let ran = t
        .status
        .as_ref()
        .is_some_and(|s| s.start_time.is_some() || s.run > 1);
    // Staging lives where the receiver ran: not in this cluster for a source half.
    let dest = obs
        .placement
        .as_ref()
        .ok()
        .map(|(_, d)| d)
        .filter(|d| d.volume != crate::placement::VolumeRef::Remote);
    if t.is_source_half() && deleting_for < Duration::from_secs(30) {
        withdraw(t, ctx).await;
    }
    let plan = cleanup::plan_cleanup(ran, dest.is_some(), &obs.pods, &cleaner, deleting_for);
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for action in &plan.actions {
        match action {
            CleanupAction::DeletePod(name) => {
                let dp = DeleteParams::default().grace_period(1);
                ignore_not_found(pods.delete(name, &dp).await.map(|_| ()))?;
            }
            CleanupAction::CreateCleanupPod => {
                let Some(dest) = dest else { continue };
                let pod = movers::cleanup_pod(&MoverPodInput {
                    swarm: None,
                    transfer: t,
                    config: &ctx.config,
                    role: MoverRole::Receiver,
                    run: 0,
                    attempt: 0,
                    placement: dest,
                    receiver_ip: None,
                    serves: &[],
                    use_block_store: false,
                    remote: None,
                });
                pods.patch(&cleaner, &ssa(), &Patch::Apply(&pod)).await?;
            }
        }
    }
    if let Some(note) = &plan.note {
        record(t, ctx, std::slice::from_ref(note)).await;
    }
    if plan.done {
        set_finalizer(t, ctx, false).await?;
        ctx.metrics.forget(&uid);
        ctx.limiter.forget(&uid);
        ctx.registry.forget(&uid);
        ctx.secrets.forget(&uid);
        ctx.own_writes.forget(&uid);
        ctx.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uid);
        return Ok(Requeue::await_change());
    }
    Ok(Requeue::requeue(Duration::from_secs(1)))
}

fn pod_prefix(uid: &str) -> String {
    // Every child name starts with this (see names.rs).
    let name = names::pod_name(uid, 0, 0, MoverRole::Sender);
    name.trim_end_matches("-0-0-send").to_owned()
}

async fn observe(t: &Transfer, ctx: &Context) -> Result<Observed, Error> {
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let mut pods: Vec<PodView> = ctx
        .caches
        .pods_of(&ns, &uid)
        .iter()
        .map(|p| pod_view(p))
        .collect();
    mount_failures(&ctx.caches, &ns, &mut pods);
    // Secrets are looked up by their deterministic names (current and previous attempt), so
    // the operator needs no right to list or watch Secrets; after the first look, the
    // operator's own creates and deletes keep the book.
    let st = t.status.clone().unwrap_or_default();
    let candidates: Vec<String> = [st.attempts.saturating_sub(1), st.attempts, st.attempts + 1]
        .into_iter()
        .filter(|a| *a > 0)
        .map(|a| names::secret_name(&uid, st.run, a))
        .collect();
    let secrets_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let secrets = ctx
        .secrets
        .existing(&secrets_api, &uid, &candidates)
        .await?
        .into_iter()
        .filter(|s| candidates.contains(s))
        .collect();

    let provision = observe_provision(t, ctx, &ns).await?;
    let source = side_facts(t, Side::Source, &ctx.caches, &ns);
    let mut destination = side_facts(t, Side::Destination, &ctx.caches, &ns);
    if matches!(provision, Some(crate::provision::ProvisionStep::Create(_))) {
        // The plan creates it before any mover that mounts it.
        destination.claim_exists = true;
    }
    let placement = placement::place_side(Side::Source, &t.spec.source, &ns, &ctx.config, &source)
        .and_then(|s| {
            placement::place_side(
                Side::Destination,
                &t.spec.destination,
                &ns,
                &ctx.config,
                &destination,
            )
            .map(|d| (s, d))
        })
        .and_then(|placed| match overlap::source_destination_overlap(t, &ns) {
            Some(message) => Err(Blocked {
                reason: Reason::SourceDestinationOverlap,
                message,
            }),
            None => Ok(placed),
        });
    // A destination another Transfer writes first: wait for it (checked only before this
    // Transfer's movers exist, so a running one is never stopped by a newcomer).
    let placement = if pods.iter().any(|p| !p.deleting) {
        placement
    } else {
        let others = ctx.store.state();
        let others: Vec<&Transfer> = others.iter().map(|o| o.as_ref()).collect();
        placement.and_then(|placed| match overlap::destination_taken_by(t, &ns, &others) {
            Some(other) => Err(Blocked {
                reason: Reason::DestinationInUse,
                message: format!(
                    "the destination is also written by Transfer {other}, which goes first; this Transfer starts once that one finishes"
                ),
            }),
            None => Ok(placed),
        })
    };

    // Progress of the current attempt's movers (a source half's carry the destination's id).
    let (run, attempt) = (st.run, st.attempts);
    let tid = st
        .remote
        .as_ref()
        .and_then(|r| r.transfer_id.clone())
        .unwrap_or_else(|| names::transfer_id(&uid, run));
    let fan_out_sender = fan_out_sender_of(t, &st, ctx, &ns, &uid);
    // A fan-out's sender serving this child: read as this child's operator, it shows this
    // destination's session; its watcher is this child's (a key under the child's prefix).
    let served_by = fan_out_sender
        .as_ref()
        .and_then(|f| f.serving.clone())
        .map(|p| (format!("{}-via-{}", pod_prefix(&uid), p.name), p));
    let progress = |role: MoverRole| {
        let (name, pod) = match (&served_by, role) {
            (Some((key, pod)), MoverRole::Sender) => (key.clone(), pod),
            _ => {
                let name = names::pod_name(&uid, run, attempt, role);
                let pod = pods.iter().find(|p| p.name == name)?;
                (name, pod)
            }
        };
        let ip: std::net::IpAddr = pod.ip.as_ref()?.parse().ok()?;
        let addr = SocketAddr::new(ip, ctx.config.progress_port);
        if pod.phase != PodPhase::Running {
            return ctx.watchers.latest(&name);
        }
        let tls = || {
            ctx.authority
                .progress_client(&tid, attempt)
                .map_err(|e| tracing::warn!("progress TLS for {tid}: {e}"))
                .ok()
        };
        ctx.watchers
            .latest_or_watch(&name, addr, tls, ObjectRef::from_obj(t))
    };
    let receiver_progress = progress(MoverRole::Receiver);
    let mut sender_progress = progress(MoverRole::Sender);
    let remote = observe_remote(t, ctx, &pods, &st, sender_progress.as_ref()).await?;
    if let Some(r) = remote.as_ref().and_then(|r| r.counterpart.as_ref())
        && let Some(report) = &r.report
        && (report.run, report.attempt) == (run, attempt)
    {
        // The other cluster's sender, as its operator reported it.
        sender_progress = report.progress.as_ref().map(Into::into);
    }
    let keep: Vec<String> = pods
        .iter()
        .map(|p| p.name.clone())
        .chain(served_by.map(|(key, _)| key))
        .collect();
    ctx.watchers.retain(&pod_prefix(&uid), &keep);

    let host_path_forbidden = ctx
        .caches
        .namespace_labels(&ns)
        .and_then(|l| l.get(PSA_ENFORCE).cloned())
        .is_some_and(|level| level == "baseline" || level == "restricted");

    let admission = admission(t, ctx);
    Ok(Observed {
        now: Timestamp::now(),
        host_path_forbidden,
        root_movers_allowed: ctx.config.allow_root_movers,
        privileged_readers_allowed: ctx.config.allow_privileged_readers,
        priority_class_refused: t
            .spec
            .mover
            .as_ref()
            .and_then(|m| m.priority_class_name.clone())
            .filter(|c| !ctx.config.priority_class_allowed(c)),
        placement,
        may_start: admission.is_ok(),
        queue: admission.err(),
        acting_since: ctx.acting_since,
        peer_silence_grace: ctx.config.peer_silence_grace,
        pending_timeout: ctx.config.mover_pending_timeout,
        pods,
        secrets,
        receiver_progress,
        sender_progress,
        remote,
        provision,
        fan_out_sender,
    })
}

/// A fan-out child's first attempt: the fan-out's senders of the run, and the one whose
/// certificate names this attempt.
fn fan_out_sender_of(
    t: &Transfer,
    st: &TransferStatus,
    ctx: &Context,
    ns: &str,
    uid: &str,
) -> Option<plan::FanOutSender> {
    if st.attempts != 1 || t.remote().is_some() {
        return None;
    }
    let parent = t.labels().get(LABEL_FAN_OUT_OF)?;
    let run = crate::fan_out::plan::run_of_trigger(t.spec.trigger.as_deref()?)?;
    let prefix = names::run_prefix(parent, run);
    let senders: Vec<Arc<Pod>> = ctx
        .caches
        .pods_of(ns, parent)
        .into_iter()
        .filter(|p| p.name_any().starts_with(&prefix))
        .collect();
    let me = names::transfer_id(uid, st.run);
    let serving = senders.iter().find(|p| {
        p.annotations()
            .get(ANNOTATION_SERVES)
            .is_some_and(|ids| ids.split(',').any(|id| id == me))
    });
    Some(plan::FanOutSender {
        serving: serving.map(|p| pod_view(p)),
        started: !senders.is_empty(),
    })
}

/// The destination claim to provision, as the API server has it (and the source claim, when
/// the size comes from it). Read directly: the claim cache holds names only.
async fn observe_provision(
    t: &Transfer,
    ctx: &Context,
    ns: &str,
) -> Result<Option<crate::provision::ProvisionStep>, Error> {
    let Some(pvc) = &t.spec.destination.pvc else {
        return Ok(None);
    };
    let Some(spec) = &pvc.provision else {
        return Ok(None);
    };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let destination = api.get_opt(&pvc.claim_name).await?.map(|c| claim_view(&c));
    let from_source = spec.capacity == crate::api::ClaimProvision::FROM_SOURCE;
    let source = match &t.spec.source.pvc {
        // Read while the destination exists too: a source grown since is a claim too small.
        Some(src) if from_source => Some((
            src.claim_name.as_str(),
            api.get_opt(&src.claim_name).await?.map(|c| claim_view(&c)),
        )),
        _ => None,
    };
    let source = source.as_ref().map(|(n, c)| (*n, c.as_ref()));
    Ok(Some(crate::provision::step(
        spec,
        &pvc.claim_name,
        destination.as_ref(),
        source,
    )))
}

/// A claim's size: its bound volume's, else its request.
fn claim_view(c: &PersistentVolumeClaim) -> crate::provision::ClaimView {
    let bound = c
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|m| m.get("storage"));
    let requested = c
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|m| m.get("storage"));
    crate::provision::ClaimView {
        capacity: bound.or(requested).and_then(|q| plan::parse_quantity(&q.0)),
    }
}

/// The nodes a Transfer's movers run on, or must run on.
fn transfer_nodes(t: &Transfer) -> BTreeSet<String> {
    let mut nodes = BTreeSet::new();
    if let Some(s) = &t.status {
        nodes.extend(
            s.receiver
                .iter()
                .chain(&s.sender)
                .filter_map(|m| m.node.clone()),
        );
    }
    for ep in [&t.spec.source, &t.spec.destination] {
        if let Some(hp) = ep.host_path.as_ref().filter(|hp| !hp.node.is_empty()) {
            nodes.insert(hp.node.clone());
        }
    }
    nodes
}

fn limits_of(c: &Config) -> limits::Limits {
    limits::Limits {
        total: c.max_active,
        per_node: c.max_active_per_node,
        per_namespace: c.max_active_per_namespace,
    }
}

/// Whether the concurrency limits leave room for `t`'s movers now, or where it waits.
fn admission(t: &Transfer, ctx: &Context) -> Result<(), limits::Queued> {
    let limits = limits_of(&ctx.config);
    if limits == limits::Limits::default() {
        return Ok(());
    }
    let (active, mut waiting) = slots_besides(t, &ctx.store.state());
    waiting.insert(0, waiting_of(t));
    limits::admission(limits, &waiting[0], &transfer_nodes(t), &active, &waiting)
}

/// `t` as the limits' queue sees it. A retry (its last attempt failed or stalled) lets
/// Transfers queued for their first start go first, so a stuck Transfer cannot take its slot
/// back before them again and again.
fn waiting_of(t: &Transfer) -> limits::Waiting {
    limits::Waiting::of(t, transfer_nodes(t))
}

/// Every Transfer but `t` that holds a slot, and every one that waits for one (queued, or not
/// looked at yet).
fn slots_besides(
    t: &Transfer,
    all: &[Arc<Transfer>],
) -> (Vec<limits::Active>, Vec<limits::Waiting>) {
    let (mut active, mut waiting) = (Vec::new(), Vec::new());
    for o in all {
        // A fan-out runs no movers itself; its children are counted.
        if o.uid() == t.uid() || o.metadata.deletion_timestamp.is_some() || o.is_fan_out() {
            continue;
        }
        match &o.status {
            Some(s) if limits::holds_a_slot(s) => active.push(limits::Active {
                namespace: o.namespace().unwrap_or_default(),
                nodes: transfer_nodes(o),
            }),
            Some(s) if limits::queued(s) => waiting.push(waiting_of(o)),
            None => waiting.push(waiting_of(o)),
            Some(_) => {}
        }
    }
    (active, waiting)
}

/// What each of a fan-out child's siblings (by destination node) does while `t` receives: it
/// holds the whole tree when it succeeded in this run; it is idle when it failed or is
/// suspended, or when, under concurrency limits, it stays queued once `t` holds its slot (the
/// limits' hand-out in the fair order, run for all the siblings at once); otherwise it receives.
/// An idle sibling's share is asked of the source from the start instead of being waited for
/// (`--swarm-wait`) and then asked for anyway; a holder's is taken from its store.
fn sibling_roles(
    t: &Transfer,
    all: &[Arc<Transfer>],
    limits: limits::Limits,
) -> BTreeMap<String, SiblingRole> {
    let Some(parent) = t.labels().get(names::LABEL_FAN_OUT_OF) else {
        return BTreeMap::new();
    };
    let admitted = (limits != limits::Limits::default()).then(|| {
        let (mut active, waiting) = slots_besides(t, all);
        active.push(limits::Active {
            namespace: t.namespace().unwrap_or_default(),
            nodes: transfer_nodes(t),
        });
        limits::admitted(limits, &active, &waiting)
    });
    let siblings = all.iter().filter(|o| {
        o.uid() != t.uid()
            && o.namespace() == t.namespace()
            && o.labels().get(names::LABEL_FAN_OUT_OF) == Some(parent)
    });
    siblings
        .filter_map(|o| {
            let node = o.spec.destination.host_path.as_ref()?.node.clone();
            // A status of an earlier run (a new one is starting) says nothing of this one.
            let status = o.status.as_ref().filter(|s| {
                o.spec.trigger == t.spec.trigger && s.observed_trigger == o.spec.trigger
            });
            let queued = admitted.as_ref().is_some_and(|a| {
                status.is_none_or(|s| !limits::holds_a_slot(s))
                    && !a.contains(&o.uid().unwrap_or_default())
            });
            Some((node, crate::fan_out::sibling_role(status, queued)))
        })
        .collect()
}

pub(crate) fn side_facts(t: &Transfer, side: Side, caches: &Caches, ns: &str) -> SideFacts {
    let ep = t.endpoint(side);
    let mut facts = SideFacts::default();
    if let Some(hp) = &ep.host_path {
        facts.node_exists = caches.node(&hp.node).is_some();
    }
    if let Some(pvc) = &ep.pvc {
        facts.claim_exists = caches.claim_exists(ns, &pvc.claim_name);
        if facts.claim_exists {
            facts.claim_in_use_on = caches.claim_users.node_of(ns, &pvc.claim_name);
        }
    }
    facts
}

/// How long a pod may be pending before a failed mount is looked for (most pods start within
/// this).
const MOUNT_CHECK_AFTER: Duration = Duration::from_secs(5);

/// Marks pending pods whose volume the kubelet cannot mount (a missing host root, a claim that
/// cannot attach): that is only said in an Event, never in the pod's status.
fn mount_failures(caches: &Caches, ns: &str, pods: &mut [PodView]) {
    let now = Timestamp::now();
    for p in pods.iter_mut().filter(|p| {
        p.phase == PodPhase::Pending
            && p.stuck.is_none()
            && !p.deleting
            && p.created.is_some_and(|at| {
                Duration::try_from(now.duration_since(at)).unwrap_or_default() >= MOUNT_CHECK_AFTER
            })
    }) {
        if let Some(message) = caches.mount_failure(ns, &p.name) {
            p.stuck = Some(Stuck {
                reason: Reason::MoverVolumeMountFailed,
                cause: "FailedMount".into(),
                message,
            });
        }
    }
}

pub(crate) fn pod_view(p: &Pod) -> PodView {
    let status = p.status.clone().unwrap_or_default();
    let phase = match status.phase.as_deref() {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        _ => PodPhase::Pending,
    };
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.clone());
    let message = terminated.as_ref().and_then(|t| t.message.clone());
    let exit_code = terminated.as_ref().map(|t| t.exit_code);
    let finished_at = terminated.and_then(|t| t.finished_at).map(|t| t.0);
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.waiting.clone());
    let stuck = waiting
        .and_then(|w| {
            let cause = w.reason?;
            let reason = match cause.as_str() {
                "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull" => {
                    Reason::MoverImagePullFailed
                }
                "CreateContainerConfigError" | "CreateContainerError" => Reason::MoverConfigError,
                _ => return None,
            };
            Some(Stuck {
                reason,
                cause,
                message: w.message.unwrap_or_default(),
            })
        })
        .or_else(|| {
            status.conditions.iter().flatten().find_map(|c| {
                (c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable"))
                .then(|| Stuck {
                    reason: Reason::MoverUnschedulable,
                    cause: "Unschedulable".into(),
                    message: c.message.clone().unwrap_or_default(),
                })
            })
        });
    PodView {
        name: p.name_any(),
        phase,
        ready,
        ip: status.pod_ip.filter(|ip| !ip.is_empty()),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        message,
        exit_code,
        finished_at,
        created: p.metadata.creation_timestamp.as_ref().map(|t| t.0),
        stuck,
        deleting: p.metadata.deletion_timestamp.is_some(),
    }
}

pub(crate) fn ssa() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// Deletes `name`; one that is gone already is no error.
pub(crate) async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    ignore_not_found(api.delete(name, &DeleteParams::default()).await.map(|_| ()))
}

pub(crate) fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn apply(
    t: &Transfer,
    ctx: &Context,
    obs: &Observed,
    plan: &plan::Plan,
) -> Result<(), Error> {
    let actions = &plan.actions;
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let placed = obs.placement.as_ref().ok();
    // A half's movers meet the other cluster's: its name, the shared transfer id, its CA.
    let peer = match t.remote() {
        Some(r) => ctx.peers.get(&ObjectRef::new(&r.peer)),
        None => None,
    };
    let remote_ids = peer.as_ref().map(|p| RemoteIds {
        cluster: p.spec.cluster_name.clone(),
        transfer_id: plan
            .status
            .remote
            .as_ref()
            .and_then(|r| r.transfer_id.clone())
            .unwrap_or_default(),
    });
    let remote = remote_ids.as_ref();
    let peer_ca = peer.as_ref().map(|p| p.spec.ca_bundle.clone());
    let store = plan::tenancy::store_scope(t, plan.dedup);
    let use_block_store = store.is_some() && ctx.config.block_service.is_some();
    for action in actions {
        match action {
            Action::CreateSecret { run, attempt } => {
                let node = placed.and_then(|(_, dst)| dst.node.as_deref());
                let tenancy =
                    plan::tenancy::receiver_tenancy(t, *run, store, ctx.authority.cluster(), node)
                        .map_err(|_| {
                            Error::Malformed("namespace, uid, run or node a certificate can name")
                        })?;
                let files = match (remote, &peer_ca) {
                    (Some(r), Some(ca)) => {
                        let role = if t.is_source_half() {
                            ferry_proto::net::Role::Sender
                        } else {
                            ferry_proto::net::Role::Receiver
                        };
                        let mut files = ctx.authority.cross_cluster_files(
                            &r.transfer_id,
                            *attempt,
                            role,
                            &r.cluster,
                            &tenancy,
                        )?;
                        files.insert(movers::PEER_CA_KEY.to_owned(), ca.clone());
                        files
                    }
                    _ => ctx.authority.attempt_files(
                        &names::transfer_id(&uid, *run),
                        *attempt,
                        &tenancy,
                    )?,
                };
                let secret = movers::attempt_secret(t, *run, *attempt, &files);
                let name = names::secret_name(&uid, *run, *attempt);
                secrets.patch(&name, &ssa(), &Patch::Apply(&secret)).await?;
                ctx.secrets.created(&uid, &name);
                crate::network_policy::keep(t, &ctx.client, &ctx.config).await?;
            }
            Action::CreateReceiver { run, attempt } => {
                let Some((_, dst)) = placed else { continue };
                // A fan-out child takes blocks from its siblings until an attempt failed; a
                // retry asks the source for all it lacks (a sibling may be what failed).
                let swarm = match (&dst.node, &ctx.config.block_service) {
                    (Some(node), Some(service)) if use_block_store && plan.status.failures == 0 => {
                        let limits = limits_of(&ctx.config);
                        let roles = sibling_roles(t, &ctx.store.state(), limits);
                        crate::fan_out::swarm_of(t, node, &ctx.caches, service, &roles)
                    }
                    _ => None,
                };
                let pod = movers::mover_pod(&MoverPodInput {
                    swarm: swarm.as_ref(),
                    transfer: t,
                    config: &ctx.config,
                    role: MoverRole::Receiver,
                    run: *run,
                    attempt: *attempt,
                    placement: dst,
                    receiver_ip: None,
                    serves: &[],
                    use_block_store,
                    remote: remote.map(|r| RemoteMover {
                        peer_cluster: &r.cluster,
                        transfer_id: &r.transfer_id,
                        connect: None,
                    }),
                });
                pods.patch(&pod.name_any(), &ssa(), &Patch::Apply(&pod))
                    .await?;
            }
            Action::CreateSender {
                run,
                attempt,
                receiver_ip,
            } => {
                let Some((src, _)) = placed else { continue };
                let pod = movers::mover_pod(&MoverPodInput {
                    swarm: None,
                    transfer: t,
                    config: &ctx.config,
                    role: MoverRole::Sender,
                    run: *run,
                    attempt: *attempt,
                    placement: src,
                    receiver_ip: Some(receiver_ip),
                    serves: &[],
                    use_block_store: false,
                    remote: None,
                });
                pods.patch(&pod.name_any(), &ssa(), &Patch::Apply(&pod))
                    .await?;
            }
            Action::CreateRemoteSender {
                run,
                attempt,
                address,
            } => {
                let (Some((src, _)), Some(r)) = (placed, remote) else {
                    continue;
                };
                let pod = movers::mover_pod(&MoverPodInput {
                    swarm: None,
                    transfer: t,
                    config: &ctx.config,
                    role: MoverRole::Sender,
                    run: *run,
                    attempt: *attempt,
                    placement: src,
                    receiver_ip: None,
                    serves: &[],
                    use_block_store: false,
                    remote: Some(RemoteMover {
                        peer_cluster: &r.cluster,
                        transfer_id: &r.transfer_id,
                        connect: Some(address),
                    }),
                });
                pods.patch(&pod.name_any(), &ssa(), &Patch::Apply(&pod))
                    .await?;
            }
            Action::ApplyReceiverService { run, attempt } => {
                let svc = movers::receiver_service(t, &ctx.config, *run, *attempt);
                let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
                api.patch(&svc.name_any(), &ssa(), &Patch::Apply(&svc))
                    .await?;
            }
            Action::CreateClaim(req) => {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
                let claim = crate::provision::claim_object(t, req);
                match api.create(&PostParams::default(), &claim).await {
                    Ok(_) => {}
                    // Created by a reconcile whose status write was lost, or by someone else:
                    // the next look sizes it up.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Action::DeleteService(name) => {
                let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
                ignore_not_found(api.delete(name, &DeleteParams::default()).await.map(|_| ()))?;
            }
            Action::DeletePod(name) => delete_if_present(&pods, name).await?,
            Action::DeleteSecret(name) => {
                delete_if_present(&secrets, name).await?;
                ctx.secrets.deleted(&uid, name);
            }
            Action::DeleteTransfer => {
                let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ns);
                ignore_not_found(
                    api.delete(&t.name_any(), &DeleteParams::default())
                        .await
                        .map(|_| ()),
                )?;
            }
        }
    }
    Ok(())
}

/// The other cluster's name and the transfer id both clusters' movers carry.
struct RemoteIds {
    cluster: String,
    transfer_id: String,
}

/// What became of a planned status.
pub(crate) enum Written {
    /// Written (or already current).
    Now,
    /// Only progress changed, and the patch rate limit defers it this long.
    Later(Duration),
    /// The Transfer changed after it was read (its resourceVersion moved on): not written.
    Stale,
}

/// Server-side apply of the status subresource when it changed, on the version `t` was read
/// at; a change of progress alone waits for the limiter.
pub(crate) async fn write_status(
    t: &Transfer,
    ctx: &Context,
    status: &crate::api::TransferStatus,
) -> Result<Written, Error> {
    let old = t.status.clone().unwrap_or_default();
    if t.status.as_ref() == Some(status) {
        return Ok(Written::Now);
    }
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let now = std::time::Instant::now();
    let progress_only = crate::status::progress_only(&old, status);
    if let Some(wait) = ctx.limiter.defer(&uid, progress_only, now) {
        return Ok(Written::Later(wait));
    }
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = serde_json::json!({
        "apiVersion": Transfer::api_version(&()),
        "kind": Transfer::kind(&()),
        // A precondition: the status was planned from this version of the Transfer, and must
        // not land on another (a concurrent edit, or a second operator during a handover).
        "metadata": {"resourceVersion": t.resource_version()},
        "status": status,
    });
    match api
        .patch_status(&t.name_any(), &ssa(), &Patch::Apply(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Written::Stale),
        Err(e) => return Err(e.into()),
    }
    ctx.limiter.patched(&uid, now);
    ctx.own_writes.wrote(&uid, t.resource_version());
    ctx.metrics.status_patch(progress_only);
    Ok(Written::Now)
}

pub(crate) async fn record(t: &Transfer, ctx: &Context, notes: &[plan::Note]) {
    for n in notes {
        let event = Event {
            type_: if n.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: n.reason.to_owned(),
            note: Some(n.message.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&event, &t.object_ref(&())).await {
            tracing::debug!("failed to record an event: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, SiblingRole, limits, retry_after, sibling_roles};
    use crate::api::{Phase, Transfer, TransferStatus};
    use crate::names::LABEL_FAN_OUT_OF;
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;
    use std::time::Duration;

    /// Child `i` of fan-out "imagenet" from node "src" to node `d{i}`, created at second `i`.
    fn child(i: i64, phase: Option<Phase>) -> Arc<Transfer> {
        let mut t = crate::plan::tests::transfer();
        t.metadata.name = Some(format!("imagenet-d{i}"));
        t.metadata.uid = Some(format!("uid-{i}"));
        t.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + i).unwrap(),
        ));
        t.metadata.labels = Some(BTreeMap::from([(
            LABEL_FAN_OUT_OF.to_owned(),
            "imagenet".to_owned(),
        )]));
        let (src, dst) = (
            t.spec.source.host_path.as_mut().unwrap(),
            t.spec.destination.host_path.as_mut().unwrap(),
        );
        src.node = "src".into();
        dst.node = format!("d{i}");
        t.status = phase.map(|phase| TransferStatus {
            phase,
            ..TransferStatus::default()
        });
        Arc::new(t)
    }

    fn set(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|n| (*n).to_owned()).collect()
    }

    /// The siblings of `roles` with `role`.
    fn with(roles: &BTreeMap<String, SiblingRole>, role: SiblingRole) -> BTreeSet<String> {
        roles
            .iter()
            .filter(|(_, r)| **r == role)
            .map(|(n, _)| n.clone())
            .collect()
    }

    #[test]
    fn siblings_the_limits_keep_queued_beside_a_starting_child_are_idle() {
        // d1 starts; the others have not been looked at yet (no status), as when a fan-out's
        // children are all created at once.
        let all: Vec<_> = (1..=5).map(|i| child(i, None)).collect();
        let per_node = |n| limits::Limits {
            per_node: n,
            ..limits::Limits::default()
        };
        let idle = |l| with(&sibling_roles(&all[0], &all, l), SiblingRole::Idle);
        // Every child's sender runs on "src": with one slot per node, none starts beside d1.
        assert_eq!(idle(per_node(1)), set(&["d2", "d3", "d4", "d5"]));
        // With three, the next two in line start beside it; the last two wait.
        assert_eq!(idle(per_node(3)), set(&["d4", "d5"]));
        // Without limits every sibling receives (or starts to).
        let free = sibling_roles(&all[0], &all, limits::Limits::default());
        assert_eq!(with(&free, SiblingRole::Receives).len(), 4);
    }

    #[test]
    fn a_succeeded_sibling_holds_the_tree_and_a_failed_one_never_will() {
        let all = vec![
            child(1, Some(Phase::Succeeded)),
            child(2, None),
            child(3, Some(Phase::Failed)),
            child(4, Some(Phase::Suspended)),
            child(5, Some(Phase::Running)),
        ];
        let one = limits::Limits {
            per_node: 1,
            ..limits::Limits::default()
        };
        for l in [limits::Limits::default(), one] {
            // d5 runs (it holds its slot, though the limit says one per node); d1 is done.
            let roles = sibling_roles(&all[1], &all, l);
            assert_eq!(with(&roles, SiblingRole::Idle), set(&["d3", "d4"]));
            assert_eq!(with(&roles, SiblingRole::Holds), set(&["d1"]));
            assert_eq!(with(&roles, SiblingRole::Receives), set(&["d5"]));
        }
        // A status of an earlier run counts for nothing: d1 (succeeded then) is looked at as
        // new, and waits behind the limit.
        let mut rerun: Vec<_> = all.iter().map(|c| (**c).clone()).collect();
        for c in &mut rerun {
            c.spec.trigger = Some("run-2".into());
        }
        let rerun: Vec<_> = rerun.into_iter().map(Arc::new).collect();
        let roles = sibling_roles(&rerun[1], &rerun, one);
        assert_eq!(with(&roles, SiblingRole::Holds), BTreeSet::new());
        assert_eq!(roles["d1"], SiblingRole::Idle);
        // Not a fan-out's child: no siblings.
        let lone = Arc::new(crate::plan::tests::transfer());
        assert!(sibling_roles(&lone, &all, one).is_empty());
    }

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
