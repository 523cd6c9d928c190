//! One pod's lifecycle on a simulated node: address, volumes and environment, init containers in
//! order, app containers under the restart policy with readiness probes, status reports, and on
//! deletion SIGTERM → grace period → SIGKILL → removal of the pod object.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use crate::AgentConfig;
use crate::env::{PodFacts, container_env};
use crate::node::NodeIdentity;
use crate::podip::PodIpAllocator;
use crate::probes::{self, ProbeKind, ProbeTiming, Prober, Verdict};
use crate::process::{self, BindMount, Launch};
use crate::sandbox::Sandbox;
use crate::status::{self, ContainerView, PodStatusInput, State, Terminated};
use crate::volumes::{ResolvedVolume, VolumeContext};

/// What every pod runner of a node shares.
pub struct NodeContext {
    pub client: Client,
    pub config: Arc<AgentConfig>,
    pub node: Arc<NodeIdentity>,
    pub ips: PodIpAllocator,
}

/// The longest a termination message may be, like the kubelet's 4 KiB limit.
const MAX_TERMINATION_MESSAGE: u64 = 4096;
const TICK: Duration = Duration::from_millis(250);
/// The status is patched at most this often, and at once after a change.
const STATUS_REFRESH: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Volume(#[from] crate::volumes::VolumeError),
    #[error(transparent)]
    Env(#[from] crate::env::EnvError),
    #[error(
        "container {container}: image {image} maps to no local binary and the pod gives no command"
    )]
    NoCommand { container: String, image: String },
    #[error("container {container}: program {program} not found on the node")]
    NoProgram { container: String, program: String },
    #[error("container {container} mounts volume {volume}, which the pod does not declare")]
    UnknownVolume { container: String, volume: String },
    #[error("container {container}: subPath {sub_path:?} escapes volume {volume}")]
    BadSubPath {
        container: String,
        volume: String,
        sub_path: String,
    },
    #[error("failed to set up the pod's network")]
    Network(#[from] crate::podnet::PodNetError),
    #[error("failed to create {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One container as the runner tracks it.
struct Ctr {
    spec: Container,
    launch: Launch,
    view: ContainerView,
    pgid: Option<i32>,
    /// Bumped at every start so a late exit report of an earlier run is recognised.
    generation: u64,
    restart_at: Option<Instant>,
    /// Startup, liveness and readiness probes, as declared.
    probers: Vec<Prober>,
    /// The startup probe has passed (or there is none): liveness and readiness run.
    started: bool,
    /// A declared probe the agent cannot run: the container fails to start with this.
    probe_error: Option<String>,
    /// Why the container may not start at all (runAsNonRoot): it stays waiting with this.
    config_error: Option<String>,
    termination_log: PathBuf,
    fallback_to_logs: bool,
    /// Why the last start failed, reported as the termination message.
    start_error: Option<String>,
}

struct Exit {
    index: usize,
    generation: u64,
    code: i32,
    signal: Option<i32>,
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The effective user, group and supplementary groups of a container.
fn identity(
    pod_sc: Option<&PodSecurityContext>,
    sc: Option<&SecurityContext>,
) -> (Option<u32>, Option<u32>, Vec<u32>) {
    let to_u32 = |v: Option<i64>| v.and_then(|v| u32::try_from(v).ok());
    let uid = to_u32(
        sc.and_then(|s| s.run_as_user)
            .or(pod_sc.and_then(|s| s.run_as_user)),
    );
    let gid = to_u32(
        sc.and_then(|s| s.run_as_group)
            .or(pod_sc.and_then(|s| s.run_as_group)),
    );
    let mut groups: Vec<u32> = Vec::new();
    if let Some(g) = to_u32(pod_sc.and_then(|s| s.fs_group)) {
        groups.push(g);
    }
    for g in pod_sc
        .and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default()
    {
        if let Ok(g) = u32::try_from(g) {
            groups.push(g);
        }
    }
    // A user without a group runs with group 0, as in a container image without USER group.
    let gid = gid.or(uid.map(|_| 0));
    (uid, gid, groups)
}

impl NodeContext {
    /// Runs the pod until it is deleted (then removes it) or the agent shuts down.
    pub async fn run_pod(
        self: Arc<Self>,
        mut updates: watch::Receiver<Option<Pod>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let Some(pod) = updates.borrow().clone() else {
            return;
        };
        let key = pod_key(&pod);
        let already_terminal = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if pod.metadata.deletion_timestamp.is_some() && !already_terminal {
            // Deleted before this node ran it (evicted while the node was down, say): nothing
            // starts; the pod ends Failed and goes.
            let api: Api<Pod> = Api::namespaced(
                self.client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or("default"),
            );
            let body = serde_json::json!({"status": {
                "phase": "Failed",
                "reason": "Terminated",
                "message": "deleted before it ran on this node",
            }});
            let name = pod.metadata.name.clone().unwrap_or_default();
            let _ = api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(body))
                .await;
            self.remove_pod_object(&pod).await;
            return;
        }
        let terminal = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if terminal && pod.metadata.deletion_timestamp.is_none() {
            // Finished before this agent started: nothing to run, only deletion to honour.
            loop {
                tokio::select! {
                    r = updates.changed() => if r.is_err() { return },
                    _ = shutdown.changed() => return,
                }
                let current = updates.borrow().clone();
                match current {
                    None => return,
                    Some(p) if p.metadata.deletion_timestamp.is_some() => {
                        self.remove_pod_object(&p).await;
                        return;
                    }
                    Some(_) => {}
                }
            }
        }
        // A hostNetwork pod shares the node's namespace and address.
        let allocated = if host_network(&pod) {
            None
        } else {
            match self.ips.allocate() {
                Ok(ip) => Some(ip),
                Err(e) => {
                    tracing::error!(pod = %key, error = %e, "cannot run pod");
                    return;
                }
            }
        };
        let ip = allocated.unwrap_or(self.node.ip);
        let mut runner = PodRunner {
            ctx: self.clone(),
            pod,
            key,
            ip: IpAddr::V4(ip),
            start_time: Timestamp::now(),
            init: Vec::new(),
            main: Vec::new(),
            blocked: None,
            pod_dir: PathBuf::new(),
            net: None,
        };
        runner.run(&mut updates, &mut shutdown).await;
        if let Some(ip) = allocated {
            self.ips.release(ip);
        }
    }

    async fn remove_pod_object(&self, pod: &Pod) {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => tracing::info!(pod = %pod_key(pod), "pod removed"),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => tracing::warn!(pod = %pod_key(pod), error = %e, "failed to remove pod"),
        }
    }
}

struct PodRunner {
    ctx: Arc<NodeContext>,
    pod: Pod,
    key: String,
    ip: IpAddr,
    start_time: Timestamp,
    init: Vec<Ctr>,
    main: Vec<Ctr>,
    blocked: Option<String>,
    pod_dir: PathBuf,
    /// The pod's network namespace, once made (None for hostNetwork pods).
    net: Option<crate::podnet::PodNetwork>,
}

fn has_readiness(ctr: &Ctr) -> bool {
    ctr.probers.iter().any(|p| p.kind == ProbeKind::Readiness)
}

fn host_network(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network) == Some(true)
}

/// Whether the pod's resolv.conf points at the cluster DNS, per its dnsPolicy.
fn uses_cluster_dns(pod: &Pod) -> bool {
    match pod.spec.as_ref().and_then(|s| s.dns_policy.as_deref()) {
        None | Some("ClusterFirst") => !host_network(pod),
        Some("ClusterFirstWithHostNet") => true,
        _ => false,
    }
}

enum End {
    Deleted(Box<Pod>),
    Vanished,
    Shutdown,
}

impl PodRunner {
    fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or("default")
    }

    fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or("")
    }

    fn uid(&self) -> &str {
        self.pod.metadata.uid.as_deref().unwrap_or("")
    }

    fn restart_policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    async fn run(
        &mut self,
        updates: &mut watch::Receiver<Option<Pod>>,
        shutdown: &mut watch::Receiver<bool>,
    ) {
        let config = self.ctx.config.clone();
        self.pod_dir = config
            .node_root(&self.ctx.node.name)
            .join("var/lib/kubelet/pods")
            .join(self.uid());
        let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<Exit>();
        let mut last_patch: Option<(serde_json::Value, Instant)> = None;
        let mut prepared = false;
        let mut next_prepare = Instant::now();
        let mut tick = tokio::time::interval(TICK);
        let end = loop {
            tokio::select! {
                _ = tick.tick() => {}
                Some(exit) = exit_rx.recv() => self.on_exit(exit),
                r = updates.changed() => {
                    if r.is_err() { break End::Vanished; }
                    let current = updates.borrow().clone();
                    match current {
                        None => break End::Vanished,
                        Some(p) if p.metadata.deletion_timestamp.is_some() => break End::Deleted(Box::new(p)),
                        Some(p) => self.pod = p,
                    }
                }
                _ = shutdown.changed() => break End::Shutdown,
            }
            if !prepared && Instant::now() >= next_prepare {
                match self.prepare().await {
                    Ok(()) => {
                        prepared = true;
                        self.blocked = None;
                    }
                    Err(e) => {
                        let msg = format!("{:#}", anyhow::Error::from(e));
                        if self.blocked.as_deref() != Some(msg.as_str()) {
                            tracing::warn!(pod = %self.key, error = %msg, "pod cannot start yet; retrying");
                        }
                        self.blocked = Some(msg);
                        next_prepare = Instant::now() + Duration::from_secs(2);
                    }
                }
            }
            if prepared {
                self.start_due(&exit_tx);
                self.probe_due().await;
            }
            self.report(&mut last_patch).await;
        };
        let grace = match &end {
            End::Deleted(p) => p.metadata.deletion_grace_period_seconds.unwrap_or(30),
            End::Vanished => 0,
            End::Shutdown => 5,
        };
        self.stop_all(
            Duration::from_secs(u64::try_from(grace).unwrap_or(0)),
            &mut exit_rx,
        )
        .await;
        if let Some(net) = self.net.take() {
            net.destroy().await;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.pod_dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(pod = %self.key, error = %e, "failed to remove pod directory");
        }
        if let End::Deleted(p) = end {
            self.report_terminal().await;
            self.ctx.remove_pod_object(&p).await;
        }
    }

    /// Writes the terminal phase and final container states before the object is removed, so
    /// watchers (controllers, `kubectl get -w`) see how the pod ended.
    async fn report_terminal(&mut self) {
        let main: Vec<ContainerView> = self.main.iter().map(|c| c.view.clone()).collect();
        let mut body = self.status_body(&main);
        body["status"]["phase"] = status::terminal_phase(&main).into();
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), self.namespace());
        if let Err(e) = api
            .patch_status(
                self.name(),
                &PatchParams::default(),
                &Patch::Strategic(body),
            )
            .await
        {
            tracing::debug!(pod = %self.key, error = %e, "failed to write the terminal status");
        }
    }

    /// Resolves volumes and environments and builds each container's launch.
    async fn prepare(&mut self) -> Result<(), PrepareError> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let node = self.ctx.node.clone();
        let config = self.ctx.config.clone();
        let facts = PodFacts {
            pod_ip: self.ip.to_string(),
            host_ip: node.ip.to_string(),
            node_name: node.name.clone(),
        };
        let io = |path: &std::path::Path| {
            let path = path.to_path_buf();
            move |source| PrepareError::Io { path, source }
        };
        std::fs::create_dir_all(&self.pod_dir).map_err(io(&self.pod_dir))?;
        if self.net.is_none()
            && !host_network(&self.pod)
            && let IpAddr::V4(ip) = self.ip
        {
            self.net = Some(config.network.create(self.uid(), ip).await?);
        }
        self.write_name_files().map_err(io(&self.pod_dir))?;
        let node_root = config.node_root(&node.name);
        let pod_sc = spec.security_context.clone();
        let volumes = VolumeContext {
            client: &self.ctx.client,
            node_root: &node_root,
            pod_dir: &self.pod_dir,
            pod: &self.pod,
            facts: &facts,
            fs_group: pod_sc.as_ref().and_then(|s| s.fs_group),
        }
        .resolve_all()
        .await?;
        let mut init = Vec::new();
        for c in spec.init_containers.clone().unwrap_or_default() {
            init.push(self.build(c, &volumes, &facts, pod_sc.as_ref()).await?);
        }
        let mut main = Vec::new();
        for c in spec.containers.clone() {
            main.push(self.build(c, &volumes, &facts, pod_sc.as_ref()).await?);
        }
        self.init = init;
        self.main = main;
        Ok(())
    }

    /// The pod's /etc/hosts and, with the cluster DNS, /etc/resolv.conf, mounted into each container.
    fn write_name_files(&self) -> std::io::Result<()> {
        let IpAddr::V4(ip) = self.ip else {
            return Ok(());
        };
        let write = |name: &str, text: String| std::fs::write(self.pod_dir.join(name), text);
        if !host_network(&self.pod) {
            write("etc-hosts", crate::podnet::hosts_file(ip, &self.hostname()))?;
        }
        if uses_cluster_dns(&self.pod)
            && let Some(text) = self.ctx.config.network.resolv_conf(self.namespace())
        {
            write("etc-resolv.conf", text)?;
        }
        Ok(())
    }

    fn hostname(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| self.name().to_string())
    }

    async fn build(
        &self,
        spec: Container,
        volumes: &BTreeMap<String, ResolvedVolume>,
        facts: &PodFacts,
        pod_sc: Option<&PodSecurityContext>,
    ) -> Result<Ctr, PrepareError> {
        let config = &self.ctx.config;
        let image = spec.image.clone().unwrap_or_default();
        let mapped = config.images.resolve(&image);
        let (uid, gid, groups) = identity(pod_sc, spec.security_context.as_ref());
        // The image's USER when the pod sets none, as a container runtime does.
        let (uid, gid) = match (uid, mapped.as_ref().and_then(|m| m.user)) {
            (None, Some((u, g))) => (Some(u), gid.or(Some(g))),
            _ => (uid, gid),
        };
        let env = container_env(
            &self.ctx.client,
            &self.pod,
            &spec,
            facts,
            (&config.apiserver_host, config.apiserver_port),
            uid.unwrap_or(0) == 0,
        )
        .await?;
        let vars: BTreeMap<String, String> = env.iter().cloned().collect();
        let expand = |s: &String| crate::env::expand(s, &vars);
        let command: Vec<String> = spec.command.iter().flatten().map(expand).collect();
        let args: Vec<String> = spec.args.iter().flatten().map(expand).collect();
        let mapped = mapped.map(|m| m.program);
        let path_var = vars.get("PATH").cloned().unwrap_or_default();
        let (program, mut argv) = match (mapped, command.split_first()) {
            (Some(bin), None) => (bin, Vec::new()),
            (Some(bin), Some((first, rest)))
                if std::path::Path::new(first).file_name() == bin.file_name() =>
            {
                (bin, rest.to_vec())
            }
            (_, Some((first, rest))) => {
                let program = process::find_program(first, &path_var).ok_or_else(|| {
                    PrepareError::NoProgram {
                        container: spec.name.clone(),
                        program: first.clone(),
                    }
                })?;
                (program, rest.to_vec())
            }
            (None, None) => {
                return Err(PrepareError::NoCommand {
                    container: spec.name.clone(),
                    image,
                });
            }
        };
        argv.extend(args);

        let mut mounts = Vec::new();
        for m in spec.volume_mounts.iter().flatten() {
            let volume = volumes
                .get(&m.name)
                .ok_or_else(|| PrepareError::UnknownVolume {
                    container: spec.name.clone(),
                    volume: m.name.clone(),
                })?;
            let sub = m.sub_path.clone().unwrap_or_default();
            let source = if sub.is_empty() {
                volume.host_path.clone()
            } else {
                let p = crate::path_under(&volume.host_path, &sub).ok_or_else(|| {
                    PrepareError::BadSubPath {
                        container: spec.name.clone(),
                        volume: m.name.clone(),
                        sub_path: sub.clone(),
                    }
                })?;
                if !p.exists() {
                    std::fs::create_dir_all(&p).map_err(|source| PrepareError::Io {
                        path: p.clone(),
                        source,
                    })?;
                }
                p
            };
            mounts.push(BindMount {
                source,
                target: PathBuf::from(&m.mount_path),
                read_only: m.read_only.unwrap_or(false) || volume.always_read_only,
            });
        }
        // The termination message file: a per-container file mounted at terminationMessagePath.
        let ctr_dir = self.pod_dir.join("containers").join(&spec.name);
        std::fs::create_dir_all(&ctr_dir).map_err(|source| PrepareError::Io {
            path: ctr_dir.clone(),
            source,
        })?;
        let termination_log = ctr_dir.join("termination-log");
        std::fs::write(&termination_log, b"").map_err(|source| PrepareError::Io {
            path: termination_log.clone(),
            source,
        })?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ =
                std::fs::set_permissions(&termination_log, std::fs::Permissions::from_mode(0o666));
        }
        let sandbox = Sandbox::of(spec.security_context.as_ref());
        // A /tmp of the container's own, part of its root file system (so read-only with it),
        // unless a volume is mounted there.
        if !mounts
            .iter()
            .any(|m| m.target == std::path::Path::new("/tmp"))
        {
            let tmp = ctr_dir.join("tmp");
            std::fs::create_dir_all(&tmp).map_err(|source| PrepareError::Io {
                path: tmp.clone(),
                source,
            })?;
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777));
            // Volumes mounted below /tmp need their mount points inside this /tmp, which may be
            // read-only in the container: made here, as a runtime makes them in the image's root.
            for m in &mounts {
                let Ok(rest) = m.target.strip_prefix("/tmp") else {
                    continue;
                };
                let point = tmp.join(rest);
                let made = if m.source.is_dir() {
                    std::fs::create_dir_all(&point)
                } else {
                    point
                        .parent()
                        .map_or(Ok(()), std::fs::create_dir_all)
                        .and_then(|()| std::fs::write(&point, b""))
                };
                made.map_err(|source| PrepareError::Io {
                    path: point.clone(),
                    source,
                })?;
            }
            mounts.push(BindMount {
                source: tmp.clone(),
                target: PathBuf::from("/tmp"),
                read_only: sandbox.read_only_root,
            });
            // A program on the node under /tmp (a checkout there) would be hidden by this /tmp:
            // it is linked (or copied) to the same path inside it, as an image would carry it.
            if let Ok(rest) = program.strip_prefix("/tmp") {
                let inside = tmp.join(rest);
                let placed = inside
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| match std::fs::hard_link(&program, &inside) {
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                        Err(_) => std::fs::copy(&program, &inside).map(drop),
                        Ok(()) => Ok(()),
                    });
                placed.map_err(|source| PrepareError::Io {
                    path: inside.clone(),
                    source,
                })?;
            }
        }
        let config_error = crate::sandbox::run_as_non_root_refusal(
            pod_sc,
            spec.security_context.as_ref(),
            uid,
            &format!("{}/{}({})", self.namespace(), self.name(), self.uid()),
            &spec.name,
        );
        mounts.push(BindMount {
            source: termination_log.clone(),
            target: PathBuf::from(
                spec.termination_message_path
                    .clone()
                    .unwrap_or_else(|| "/dev/termination-log".into()),
            ),
            read_only: false,
        });
        for (file, target) in [
            ("etc-hosts", "/etc/hosts"),
            ("etc-resolv.conf", "/etc/resolv.conf"),
        ] {
            let source = self.pod_dir.join(file);
            if source.exists() {
                mounts.push(BindMount {
                    source,
                    target: PathBuf::from(target),
                    read_only: true,
                });
            }
        }
        let launch = Launch {
            container: spec.name.clone(),
            program,
            args: argv,
            env,
            working_dir: PathBuf::from(
                spec.working_dir
                    .clone()
                    .filter(|w| !w.is_empty())
                    .unwrap_or_else(|| "/".into()),
            ),
            mounts,
            uid,
            gid,
            groups,
            log_file: Some(config.log_file(self.namespace(), self.name(), &spec.name)),
            hostname: Some(self.hostname()),
            netns: self.net.as_ref().map(|n| n.netns_path()),
            sandbox,
        };
        let mut probers = Vec::new();
        let mut probe_error = None;
        for (kind, probe) in [
            (ProbeKind::Startup, &spec.startup_probe),
            (ProbeKind::Liveness, &spec.liveness_probe),
            (ProbeKind::Readiness, &spec.readiness_probe),
        ] {
            let Some(probe) = probe else { continue };
            match probes::action(probe, &spec, self.ip, &launch) {
                Ok(action) => probers.push(Prober::new(kind, action, ProbeTiming::of(probe))),
                Err(why) => probe_error = Some(format!("{kind:?} probe: {why}")),
            }
        }
        Ok(Ctr {
            view: ContainerView {
                name: spec.name.clone(),
                image: image.clone(),
                state: State::Waiting {
                    reason: "ContainerCreating".into(),
                    message: None,
                },
                last_terminated: None,
                restart_count: 0,
                ready: false,
                restart_pending: false,
            },
            fallback_to_logs: spec.termination_message_policy.as_deref()
                == Some("FallbackToLogsOnError"),
            spec,
            launch,
            pgid: None,
            generation: 0,
            restart_at: None,
            started: !probers.iter().any(|p| p.kind == ProbeKind::Startup),
            probers,
            probe_error,
            config_error,
            termination_log,
            start_error: None,
        })
    }

    /// Starts whatever should run now: the first unfinished init container, or else every app
    /// container that is waiting and whose restart backoff has passed.
    fn start_due(&mut self, exit_tx: &mpsc::UnboundedSender<Exit>) {
        let now = Instant::now();
        let due = |c: &Ctr| {
            matches!(c.view.state, State::Waiting { .. }) && c.restart_at.is_none_or(|t| t <= now)
        };
        if let Some(pos) = self
            .init
            .iter()
            .position(|c| !matches!(&c.view.state, State::Terminated(t) if t.exit_code == 0))
        {
            let c = &self.init[pos];
            if matches!(c.view.state, State::Terminated(_)) && !c.view.restart_pending {
                return; // failed for good: the pod is Failed
            }
            if due(c) {
                self.start(true, pos, exit_tx);
            }
            return;
        }
        for i in 0..self.main.len() {
            if due(&self.main[i]) {
                self.start(false, i, exit_tx);
            }
        }
    }

    fn start(&mut self, init: bool, pos: usize, exit_tx: &mpsc::UnboundedSender<Exit>) {
        // Exit reports carry init containers as usize::MAX - pos so one channel serves both lists.
        let index = if init { usize::MAX - pos } else { pos };
        let run_dir = self.ctx.config.run_dir();
        let uid = self.uid().to_string();
        let key = self.key.clone();
        let (namespace, pod_name) = (self.namespace().to_string(), self.name().to_string());
        let ctr = if init {
            &mut self.init[pos]
        } else {
            &mut self.main[pos]
        };
        if let Some(why) = &ctr.config_error {
            // As the kubelet: nothing starts; the check is made again a little later.
            ctr.view.state = State::Waiting {
                reason: "CreateContainerConfigError".into(),
                message: Some(why.clone()),
            };
            ctr.restart_at = Some(Instant::now() + Duration::from_secs(10));
            return;
        }
        ctr.generation += 1;
        ctr.restart_at = None;
        ctr.view.restart_pending = false;
        ctr.view.ready = false;
        let now = Instant::now();
        for p in &mut ctr.probers {
            p.reset(now);
        }
        ctr.started = !ctr.probers.iter().any(|p| p.kind == ProbeKind::Startup);
        let _ = std::fs::write(&ctr.termination_log, b"");
        let started = Timestamp::now();
        let spawned = match &ctr.probe_error {
            Some(why) => Err(anyhow::anyhow!("{why}")),
            None => process::spawn(&ctr.launch).map_err(anyhow::Error::from),
        };
        match spawned {
            Ok(mut child) => {
                let pgid = child.id().and_then(|p| i32::try_from(p).ok());
                ctr.pgid = pgid;
                let pgid_file = run_dir.join(format!("{uid}_{}.pgid", ctr.spec.name));
                if let Some(pgid) = pgid {
                    let _ = std::fs::write(&pgid_file, pgid.to_string());
                }
                ctr.view.state = State::Running { started };
                ctr.view.ready = ctr.started && !has_readiness(ctr);
                tracing::info!(pod = %key, container = %ctr.spec.name, pid = ?pgid, program = %ctr.launch.program.display(), "container started");
                let generation = ctr.generation;
                let tx = exit_tx.clone();
                let running = self.ctx.config.running.clone();
                let (ns, pod, name) = (namespace.clone(), pod_name.clone(), ctr.spec.name.clone());
                running.insert(&ns, &pod, &name);
                tokio::spawn(async move {
                    use std::os::unix::process::ExitStatusExt;
                    let (code, signal) = match child.wait().await {
                        Ok(s) => match (s.code(), s.signal()) {
                            (Some(c), _) => (c, None),
                            (None, Some(sig)) => (128 + sig, Some(sig)),
                            (None, None) => (255, None),
                        },
                        Err(_) => (255, None),
                    };
                    let _ = std::fs::remove_file(&pgid_file);
                    running.remove(&ns, &pod, &name);
                    let _ = tx.send(Exit {
                        index,
                        generation,
                        code,
                        signal,
                    });
                });
            }
            Err(e) => {
                let msg = format!("{e:#}");
                tracing::warn!(pod = %key, container = %ctr.spec.name, error = %msg, "container failed to start");
                // Reported like an exit so the restart policy applies.
                let generation = ctr.generation;
                let _ = exit_tx.send(Exit {
                    index,
                    generation,
                    code: 128,
                    signal: None,
                });
                ctr.start_error = Some(msg);
                ctr.view.state = State::Running { started };
            }
        }
    }

    fn on_exit(&mut self, exit: Exit) {
        let policy = self.restart_policy();
        let (init, pos) = if exit.index > usize::MAX / 2 {
            (true, usize::MAX - exit.index)
        } else {
            (false, exit.index)
        };
        let key = self.key.clone();
        let Some(ctr) = (if init {
            self.init.get_mut(pos)
        } else {
            self.main.get_mut(pos)
        }) else {
            return;
        };
        if ctr.generation != exit.generation {
            return;
        }
        let started = match &ctr.view.state {
            State::Running { started } => *started,
            _ => Timestamp::now(),
        };
        ctr.pgid = None;
        let start_error = ctr.start_error.take();
        let reason = match (&start_error, exit.code) {
            (Some(_), _) => "StartError",
            (None, 0) => "Completed",
            (None, _) => "Error",
        };
        let message = start_error.or_else(|| termination_message(ctr, exit.code));
        let terminated = Terminated {
            exit_code: exit.code,
            signal: exit.signal,
            reason: reason.into(),
            message,
            started,
            finished: Timestamp::now(),
        };
        tracing::info!(pod = %key, container = %ctr.spec.name, code = exit.code, "container exited");
        ctr.view.ready = false;
        // Init containers restart on failure unless the policy is Never; they never rerun after success.
        let restart = if init {
            exit.code != 0 && policy != "Never"
        } else {
            status::should_restart(&policy, exit.code)
        };
        if restart {
            let backoff = Duration::from_secs(1u64 << ctr.view.restart_count.clamp(0, 5));
            ctr.view.restart_count += 1;
            ctr.view.last_terminated = Some(terminated.clone());
            ctr.view.restart_pending = true;
            ctr.restart_at = Some(Instant::now() + backoff);
            ctr.view.state = State::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: Some(format!(
                    "back-off {}s restarting failed container",
                    backoff.as_secs()
                )),
            };
            if exit.code == 0 {
                ctr.view.state = State::Waiting {
                    reason: "Completed".into(),
                    message: None,
                };
            }
        } else {
            ctr.view.restart_pending = false;
            ctr.view.state = State::Terminated(terminated);
        }
    }

    /// Runs the probes that are due: the startup probe until it passes, then liveness and
    /// readiness. A liveness or startup failure kills the container; its exit then goes through
    /// the restart policy, as with the kubelet.
    async fn probe_due(&mut self) {
        let key = self.key.clone();
        for ctr in self.main.iter_mut() {
            if !matches!(ctr.view.state, State::Running { .. }) || ctr.pgid.is_none() {
                continue;
            }
            for i in 0..ctr.probers.len() {
                let now = Instant::now();
                let p = &ctr.probers[i];
                let active = match p.kind {
                    ProbeKind::Startup => !ctr.started,
                    ProbeKind::Liveness | ProbeKind::Readiness => ctr.started,
                };
                if !active || !p.due(now) {
                    continue;
                }
                let ok = probes::run(&p.action, p.timing.timeout).await;
                match ctr.probers[i].record(ok, Instant::now()) {
                    Verdict::Nothing => {}
                    Verdict::Ready(ready) => ctr.view.ready = ready,
                    Verdict::Started => {
                        ctr.started = true;
                        ctr.view.ready = !has_readiness(ctr);
                    }
                    Verdict::Restart(why) => {
                        tracing::info!(pod = %key, container = %ctr.spec.name, "{why}");
                        ctr.view.ready = false;
                        if let Some(pgid) = ctr.pgid {
                            process::signal_group(pgid, libc::SIGKILL);
                        }
                        break;
                    }
                }
            }
        }
    }

    /// Patches the pod status when it changed, or every [`STATUS_REFRESH`].
    /// The status patch for app containers shown as `main` (the init containers as they are).
    fn status_body(&self, main: &[ContainerView]) -> serde_json::Value {
        let init: Vec<ContainerView> = self.init.iter().map(|c| c.view.clone()).collect();
        let ip = self.ip.to_string();
        let host_ip = self.ctx.node.ip.to_string();
        status::patch(&PodStatusInput {
            pod_ip: &ip,
            host_ip: &host_ip,
            start_time: self.start_time,
            init: &init,
            main,
            blocked: self.blocked.as_deref(),
        })
    }

    async fn report(&mut self, last: &mut Option<(serde_json::Value, Instant)>) {
        let main: Vec<ContainerView> = if self.main.is_empty() {
            // Not prepared yet: show the declared containers as waiting.
            self.pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .map(|c| ContainerView {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    state: State::Waiting {
                        reason: "ContainerCreating".into(),
                        message: self.blocked.clone(),
                    },
                    last_terminated: None,
                    restart_count: 0,
                    ready: false,
                    restart_pending: false,
                })
                .collect()
        } else {
            self.main.iter().map(|c| c.view.clone()).collect()
        };
        let body = self.status_body(&main);
        // Compare without timestamps, which change every call.
        let fingerprint = strip_times(body.clone());
        if let Some((prev, at)) = last
            && *prev == fingerprint
            && at.elapsed() < STATUS_REFRESH
        {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), self.namespace());
        match api
            .patch_status(
                self.name(),
                &PatchParams::default(),
                &Patch::Strategic(body),
            )
            .await
        {
            Ok(_) => *last = Some((fingerprint, Instant::now())),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(pod = %self.key, error = %e, "failed to update pod status"),
        }
    }

    /// SIGTERM to every running container, SIGKILL after `grace`, and wait for the exits.
    async fn stop_all(&mut self, grace: Duration, exit_rx: &mut mpsc::UnboundedReceiver<Exit>) {
        let running = |r: &PodRunner| r.init.iter().chain(r.main.iter()).any(|c| c.pgid.is_some());
        for c in self.init.iter().chain(self.main.iter()) {
            if let Some(pgid) = c.pgid {
                process::signal_group(
                    pgid,
                    if grace.is_zero() {
                        libc::SIGKILL
                    } else {
                        libc::SIGTERM
                    },
                );
            }
        }
        let deadline = Instant::now() + grace;
        let pgids: Vec<i32> = self
            .init
            .iter()
            .chain(self.main.iter())
            .filter_map(|c| c.pgid)
            .collect();
        while running(self) && Instant::now() < deadline {
            match tokio::time::timeout_at(deadline.into(), exit_rx.recv()).await {
                Ok(Some(exit)) => self.mark_stopped(exit),
                _ => break,
            }
        }
        // Whatever is left, including children a container left behind in its group.
        for pgid in pgids {
            process::signal_group(pgid, libc::SIGKILL);
        }
        let kill_deadline = Instant::now() + Duration::from_secs(5);
        while running(self) {
            match tokio::time::timeout_at(kill_deadline.into(), exit_rx.recv()).await {
                Ok(Some(exit)) => self.mark_stopped(exit),
                _ => break,
            }
        }
        tracing::info!(pod = %self.key, "pod stopped");
    }

    fn mark_stopped(&mut self, exit: Exit) {
        let pos = if exit.index > usize::MAX / 2 {
            usize::MAX - exit.index
        } else {
            exit.index
        };
        let list = if exit.index > usize::MAX / 2 {
            &mut self.init
        } else {
            &mut self.main
        };
        if let Some(c) = list.get_mut(pos)
            && c.generation == exit.generation
        {
            c.pgid = None;
        }
    }
}

/// The termination message: the container's terminationMessagePath file, or with
/// FallbackToLogsOnError and a failure, the tail of its log.
fn termination_message(ctr: &Ctr, code: i32) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let read_tail = |path: &std::path::Path| -> Option<String> {
        let mut f = std::fs::File::open(path).ok()?;
        let len = f.metadata().ok()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(MAX_TERMINATION_MESSAGE)))
            .ok()?;
        let mut buf = Vec::new();
        f.take(MAX_TERMINATION_MESSAGE).read_to_end(&mut buf).ok()?;
        let s = String::from_utf8_lossy(&buf).into_owned();
        (!s.is_empty()).then_some(s)
    };
    let from_file = {
        let mut buf = Vec::new();
        std::fs::File::open(&ctr.termination_log)
            .ok()
            .and_then(|f| f.take(MAX_TERMINATION_MESSAGE).read_to_end(&mut buf).ok())
            .and_then(|_| (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned()))
    };
    from_file.or_else(|| {
        if ctr.fallback_to_logs && code != 0 {
            ctr.launch.log_file.as_deref().and_then(read_tail)
        } else {
            None
        }
    })
}

fn strip_times(mut v: serde_json::Value) -> serde_json::Value {
    match &mut v {
        serde_json::Value::Object(map) => {
            map.remove("lastTransitionTime");
            for value in map.values_mut() {
                *value = strip_times(value.take());
            }
        }
        serde_json::Value::Array(items) => {
            for value in items.iter_mut() {
                *value = strip_times(value.take());
            }
        }
        _ => {}
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_prefers_container_settings_and_adds_fs_group() {
        let pod_sc = PodSecurityContext {
            run_as_user: Some(1000),
            fs_group: Some(2000),
            supplemental_groups: Some(vec![3000]),
            ..Default::default()
        };
        let sc = SecurityContext {
            run_as_user: Some(1001),
            run_as_group: Some(1002),
            ..Default::default()
        };
        assert_eq!(
            identity(Some(&pod_sc), Some(&sc)),
            (Some(1001), Some(1002), vec![2000, 3000])
        );
        assert_eq!(
            identity(Some(&pod_sc), None),
            (Some(1000), Some(0), vec![2000, 3000])
        );
        assert_eq!(identity(None, None), (None, None, vec![]));
    }
}
