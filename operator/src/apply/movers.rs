//! Builders for the mover pods and the certificate Secret of one attempt (pure: no API calls).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HostPathVolumeSource, KeyToPath,
    LocalObjectReference, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, Probe, SeccompProfile, Secret, SecretVolumeSource,
    SecurityContext, Service, ServicePort, ServiceSpec, TCPSocketAction, Toleration, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

use ferry_proto::mover_args::{
    CommonArgs, MoverArgs, PeerArgs, ReceiveArgs, RoleArgs, SendArgs, SwarmArgs,
};

use crate::api::{OnUnreadable, Transfer, TransferSpec};
use crate::config::Config;
use crate::names::{self, LABEL_ATTEMPT, LABEL_ROLE, MoverRole};
use crate::plan::fan_out::sender::Served;
use crate::plan::placement::{SidePlacement, VolumeRef};

/// Where a mover sees its volume and its certificates.
const DATA_MOUNT: &str = "/ferry/data";
const TLS_MOUNT: &str = "/ferry/tls";
const NODE_LABEL: &str = "kubernetes.io/hostname";

/// What one attempt's mover pod needs besides the Transfer.
#[derive(Debug, Clone)]
pub struct MoverPodInput<'a> {
    pub transfer: &'a Transfer,
    pub config: &'a Config,
    pub role: MoverRole,
    pub run: u32,
    pub attempt: u32,
    /// Where the mover's volume is and which node it must run on.
    pub placement: &'a SidePlacement,
    /// The receiver's pod IP (sender only).
    pub receiver_ip: Option<&'a str>,
    /// A fan-out's sender: the destinations it serves, each as its child Transfer (in place of
    /// `receiver_ip`).
    pub serves: &'a [Served],
    /// Use the node's block store service (receiver with dedup on and a service configured).
    pub use_block_store: bool,
    /// Set for a half of a cross-cluster Transfer.
    pub remote: Option<RemoteMover<'a>>,
    /// A fan-out child's receiver: its siblings' block services.
    pub swarm: Option<&'a crate::plan::fan_out::Swarm>,
}

impl<'a> MoverPodInput<'a> {
    /// A mover of `role` for one attempt, placed by `placement`: no peer address, no fan-out,
    /// no block store, in this cluster only (the fields say otherwise where they must).
    pub fn new(
        transfer: &'a Transfer,
        config: &'a Config,
        role: MoverRole,
        (run, attempt): (u32, u32),
        placement: &'a SidePlacement,
    ) -> Self {
        Self {
            transfer,
            config,
            role,
            run,
            attempt,
            placement,
            receiver_ip: None,
            serves: &[],
            use_block_store: false,
            remote: None,
            swarm: None,
        }
    }
}

/// What a mover of a cross-cluster Transfer needs to meet its peer in the other cluster.
#[derive(Debug, Clone, Copy)]
pub struct RemoteMover<'a> {
    /// The other cluster's name; its CA (`peer-ca.crt` in the attempt's Secret) is trusted
    /// for that cluster's movers only.
    pub peer_cluster: &'a str,
    /// The transfer id both clusters' movers carry (the destination half's).
    pub transfer_id: &'a str,
    /// Sender only: the receiver Service's address in the other cluster.
    pub connect: Option<&'a str>,
}

/// The Secret key of the peer cluster's CA bundle.
pub const PEER_CA_KEY: &str = "peer-ca.crt";

/// The owner reference every child carries: deleting the Transfer deletes them.
pub fn owner_ref(t: &Transfer) -> Option<OwnerReference> {
    t.controller_owner_ref(&())
}

/// The admin's default tolerations plus the Transfer's own: a Transfer can add tolerations (for
/// its GPU nodes' taints) but not drop the admin's, and never one that tolerates every taint
/// (an empty key with `Exists`), which would override every taint an admin placed.
fn tolerations(admin: &[Toleration], tenant: Option<&[Toleration]>) -> Option<Vec<Toleration>> {
    let mut all = admin.to_vec();
    for t in tenant.unwrap_or_default() {
        let everything = t.key.as_deref().unwrap_or_default().is_empty()
            && t.operator.as_deref() == Some("Exists");
        if !everything && !all.contains(t) {
            all.push(t.clone());
        }
    }
    (!all.is_empty()).then_some(all)
}

/// Pod labels: the Transfer's plus role, attempt and the user's extra labels.
fn pod_labels(input: &MoverPodInput<'_>, uid: &str) -> BTreeMap<String, String> {
    let t = input.transfer;
    let mut labels = BTreeMap::new();
    // The tenant's labels, then the admin's over them (a NetworkPolicy or cost label the admin
    // sets cannot be replaced by a Transfer), then ferry's own over both.
    if let Some(m) = &t.spec.mover {
        labels.extend(m.labels.clone());
    }
    labels.extend(input.config.extra_labels.clone());
    labels.extend(names::labels(
        &t.metadata.name.clone().unwrap_or_default(),
        uid,
    ));
    labels.insert(LABEL_ROLE.to_owned(), input.role.as_str().to_owned());
    labels.insert(
        LABEL_ATTEMPT.to_owned(),
        format!("{}-{}", input.run, input.attempt),
    );
    labels
}

/// The mover's command line.
fn mover_args(input: &MoverPodInput<'_>, uid: &str) -> Vec<String> {
    let spec: &TransferSpec = &input.transfer.spec;
    let cfg = input.config;
    let role = match input.role {
        MoverRole::Receiver => {
            let block_service = cfg.block_service.clone().filter(|_| input.use_block_store);
            RoleArgs::Receive(ReceiveArgs {
                listen: format!("$(POD_IP):{}", cfg.data_port),
                once: true,
                // A root receiver keeping owners keeps setuid/setgid too, as `cp -a` as root
                // would.
                owner: spec.preserve_ownership && cfg.allow_root_movers,
                special_bits: spec.preserve_ownership && cfg.allow_root_movers,
                swarm: input
                    .swarm
                    .filter(|_| block_service.is_some())
                    .map(|swarm| SwarmArgs {
                        peers: swarm.peers.clone(),
                        me: swarm.me,
                        complete: swarm.complete.clone(),
                    }),
                block_service,
            })
        }
        MoverRole::Sender => {
            // One session per destination, each acting as the child it serves.
            let mut connect: Vec<String> = input
                .serves
                .iter()
                .map(|s| format!("{}@{}:{}", s.transfer_id, s.ip, cfg.data_port))
                .collect();
            if input.serves.is_empty() {
                connect.push(match input.remote.and_then(|r| r.connect) {
                    Some(addr) => addr.to_owned(),
                    None => format!(
                        "{}:{}",
                        input.receiver_ip.unwrap_or("0.0.0.0"),
                        cfg.data_port
                    ),
                });
            }
            RoleArgs::Send(SendArgs {
                connect,
                // A Service may forward to a new receiver a moment after it is ready, and a
                // NetworkPolicy agent may admit a new sender a moment after it starts.
                connect_retry: 30,
                streams: spec.streams.unwrap_or(cfg.default_streams).clamp(1, 16),
                compress: spec
                    .compression
                    .unwrap_or(cfg.default_compression)
                    .flag()
                    .to_owned(),
                delete: spec.delete_extraneous,
                checksum: spec.checksum,
                skip_unreadable: spec.on_unreadable == OnUnreadable::Skip,
                exclude: spec.exclude.clone(),
                bandwidth_limit: crate::plan::bandwidth_bytes(spec).ok().flatten(),
            })
        }
    };
    let (transfer, peer) = match input.remote {
        Some(r) => (
            r.transfer_id.to_owned(),
            Some(PeerArgs {
                ca: format!("{TLS_MOUNT}/{PEER_CA_KEY}"),
                cluster: r.peer_cluster.to_owned(),
            }),
        ),
        None => match input.serves.first() {
            // The certificate names the children only.
            Some(s) => (s.transfer_id.clone(), None),
            None => (names::transfer_id(uid, input.run), None),
        },
    };
    MoverArgs {
        role,
        common: CommonArgs {
            // The mounted volume (a granted host root or a claim) and the directory beneath it
            // that the mover opens itself without following a symlink.
            root: DATA_MOUNT.to_owned(),
            sub_path: Some(input.placement.sub_path.clone()).filter(|p| !p.is_empty()),
            transfer,
            peer,
            ca: format!("{TLS_MOUNT}/ca.crt"),
            cert: format!("{TLS_MOUNT}/tls.crt"),
            key: format!("{TLS_MOUNT}/tls.key"),
            progress_listen: format!("$(POD_IP):{}", cfg.progress_port),
            // The operator reads the final update within a second or two; the linger only
            // covers an operator that is restarting at that moment.
            progress_linger: 30,
            json: true,
            // Its one info line counts the blocks read from the source and those shared.
            log_level: (!input.serves.is_empty()).then(|| "info".to_owned()),
            sync: spec.sync,
        },
    }
    .to_args()
}

fn volume_for(placement: &SidePlacement, role: MoverRole) -> Volume {
    let read_only = role == MoverRole::Sender;
    match &placement.volume {
        VolumeRef::HostPath { path } => Volume {
            name: "data".into(),
            host_path: Some(HostPathVolumeSource {
                path: path.clone(),
                // A granted root, prepared by the admin: never created here (the kubelet would
                // create it as root, unwritable for the movers). Directories beneath it are
                // created by the receiver.
                type_: Some("Directory".into()),
            }),
            ..Volume::default()
        },
        VolumeRef::Claim { claim } => Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: Some(read_only),
            }),
            ..Volume::default()
        },
        // The plan never starts a mover for the side in another cluster; an empty volume keeps
        // a mistake harmless.
        VolumeRef::Remote => Volume {
            name: "data".into(),
            empty_dir: Some(Default::default()),
            ..Volume::default()
        },
    }
}

/// The mover pod of `input.role` for one attempt.
pub fn mover_pod(input: &MoverPodInput<'_>) -> Pod {
    let t = input.transfer;
    let cfg = input.config;
    let uid = t.metadata.uid.clone().unwrap_or_default();
    let name = names::pod_name(&uid, input.run, input.attempt, input.role);
    let settings = t.spec.mover.clone().unwrap_or_default();
    let root_mover = t.spec.preserve_ownership && cfg.allow_root_movers;
    // A privileged reader is uid 0 with CAP_DAC_READ_SEARCH alone: it reads anything and, on a
    // read-only volume and root file system, writes nothing.
    let reader = input.role == MoverRole::Sender
        && t.spec.read_all_files
        && cfg.allow_privileged_readers
        && !root_mover;
    let uid_gid = if root_mover || reader {
        0
    } else {
        cfg.mover_uid
    };

    let volumes = vec![
        volume_for(input.placement, input.role),
        Volume {
            name: "tls".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::secret_name(&uid, input.run, input.attempt)),
                // Each mover sees the CA(s) and its own certificate and key only.
                items: Some(
                    [
                        key_to_path("ca.crt", "ca.crt"),
                        key_to_path(&format!("{}.crt", input.role.as_str()), "tls.crt"),
                        key_to_path(&format!("{}.key", input.role.as_str()), "tls.key"),
                    ]
                    .into_iter()
                    .chain(input.remote.map(|_| key_to_path(PEER_CA_KEY, PEER_CA_KEY)))
                    .collect(),
                ),
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
    ];
    let mounts = vec![
        VolumeMount {
            name: "data".into(),
            mount_path: DATA_MOUNT.into(),
            read_only: Some(input.role == MoverRole::Sender),
            ..VolumeMount::default()
        },
        VolumeMount {
            name: "tls".into(),
            mount_path: TLS_MOUNT.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
    ];
    let ports = vec![
        ContainerPort {
            name: Some("data".into()),
            container_port: i32::from(cfg.data_port),
            ..ContainerPort::default()
        },
        ContainerPort {
            name: Some("progress".into()),
            container_port: i32::from(cfg.progress_port),
            ..ContainerPort::default()
        },
    ];
    // The progress port opens after the data port is bound, so it answering means the receiver
    // accepts connections.
    let readiness = Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::Int(i32::from(cfg.progress_port)),
            ..TCPSocketAction::default()
        }),
        period_seconds: Some(1),
        failure_threshold: Some(3),
        ..Probe::default()
    };
    let container = Container {
        name: "mover".into(),
        image: Some(cfg.mover_image.clone()),
        args: Some(mover_args(input, &uid)),
        env: Some(vec![EnvVar {
            name: "POD_IP".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }]),
        ports: Some(ports),
        readiness_probe: (input.role == MoverRole::Receiver).then_some(readiness),
        resources: settings
            .resources
            .clone()
            .or_else(|| cfg.default_resources.clone()),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(!(root_mover || reader)),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                // A root mover keeping owners needs to chown and to write into any directory.
                add: if root_mover {
                    Some(vec!["CHOWN".into(), "DAC_OVERRIDE".into(), "FOWNER".into()])
                } else if reader {
                    Some(vec!["DAC_READ_SEARCH".into()])
                } else {
                    None
                },
            }),
            ..SecurityContext::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(mounts),
        ..Container::default()
    };

    let mut annotations = settings.annotations.clone();
    annotations.insert(
        "ferry.dev/transfer-id".into(),
        names::transfer_id(&uid, input.run),
    );
    if !input.serves.is_empty() {
        let ids: Vec<&str> = input
            .serves
            .iter()
            .map(|s| s.transfer_id.as_str())
            .collect();
        annotations.insert(names::ANNOTATION_SERVES.into(), ids.join(","));
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: t.metadata.namespace.clone(),
            labels: Some(pod_labels(input, &uid)),
            annotations: Some(annotations),
            owner_references: owner_ref(t).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            node_selector: input
                .placement
                .node
                .as_ref()
                .map(|n| BTreeMap::from([(NODE_LABEL.to_owned(), n.clone())])),
            tolerations: tolerations(&cfg.default_tolerations, settings.tolerations.as_deref()),
            priority_class_name: settings
                .priority_class_name
                .clone()
                .or_else(|| cfg.default_priority_class.clone()),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(uid_gid),
                run_as_group: Some(uid_gid),
                fs_group: (!(root_mover || reader)).then_some(cfg.mover_uid),
                // Re-own a claim only when its root is not the movers' already: a recursive
                // chown of a million-file volume at every attempt would dwarf the copy.
                fs_group_change_policy: (!(root_mover || reader)).then(|| "OnRootMismatch".into()),
                run_as_non_root: Some(!(root_mover || reader)),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            termination_grace_period_seconds: Some(10),
            // Secrets of the Transfer's namespace: the operator copies no registry credentials.
            image_pull_secrets: Some(
                cfg.mover_image_pull_secrets
                    .iter()
                    .map(|name| LocalObjectReference { name: name.clone() })
                    .collect::<Vec<_>>(),
            )
            .filter(|s| !s.is_empty()),
            containers: vec![container],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The pod that removes the staging data of every run of a deleted Transfer from its
/// destination: the receiver's pod (same node, volume, user and lock-down) running
/// `ferry-mover clean-staging` instead, without certificates or ports.
pub fn cleanup_pod(input: &MoverPodInput<'_>) -> Pod {
    let mut pod = mover_pod(&MoverPodInput {
        swarm: None,
        role: MoverRole::Receiver,
        use_block_store: false,
        remote: None,
        receiver_ip: None,
        serves: &[],
        ..input.clone()
    });
    let uid = input.transfer.metadata.uid.clone().unwrap_or_default();
    pod.metadata.name = Some(names::cleanup_pod_name(&uid));
    if let Some(labels) = pod.metadata.labels.as_mut() {
        labels.insert(LABEL_ROLE.to_owned(), "cleanup".to_owned());
        labels.remove(LABEL_ATTEMPT);
    }
    // Owned by nobody: the Transfer is going away, and the operator deletes this pod itself.
    pod.metadata.owner_references = None;
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes
            .get_or_insert_with(Vec::new)
            .retain(|v| v.name == "data");
        for c in &mut spec.containers {
            let mut args = vec![
                "clean-staging".to_owned(),
                "--root".into(),
                DATA_MOUNT.into(),
            ];
            if !input.placement.sub_path.is_empty() {
                args.extend(["--sub-path".to_owned(), input.placement.sub_path.clone()]);
            }
            args.extend(["--transfer-prefix".to_owned(), format!("{uid}.")]);
            c.args = Some(args);
            c.env = None;
            c.ports = None;
            c.readiness_probe = None;
            if let Some(m) = c.volume_mounts.as_mut() {
                m.retain(|m| m.name == "data");
            }
        }
    }
    pod
}

/// The Service in front of a cross-cluster destination's receiver of (run, attempt): a
/// NodePort or LoadBalancer (the operator's `--peering-service-type`) the other cluster's
/// sender connects to. Only the data port is exposed; the progress port stays in-cluster.
pub fn receiver_service(t: &Transfer, config: &Config, run: u32, attempt: u32) -> Service {
    let uid = t.metadata.uid.clone().unwrap_or_default();
    let mut labels = names::labels(&t.metadata.name.clone().unwrap_or_default(), &uid);
    labels.insert(
        LABEL_ROLE.to_owned(),
        MoverRole::Receiver.as_str().to_owned(),
    );
    let selector = BTreeMap::from([
        (names::LABEL_TRANSFER_UID.to_owned(), uid.clone()),
        (
            LABEL_ROLE.to_owned(),
            MoverRole::Receiver.as_str().to_owned(),
        ),
        (LABEL_ATTEMPT.to_owned(), format!("{run}-{attempt}")),
    ]);
    Service {
        metadata: ObjectMeta {
            name: Some(names::service_name(&uid, run)),
            namespace: t.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: owner_ref(t).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(config.peering_service_type.clone()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("data".into()),
                port: i32::from(config.data_port),
                target_port: Some(IntOrString::Int(i32::from(config.data_port))),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn key_to_path(key: &str, path: &str) -> KeyToPath {
    KeyToPath {
        key: key.into(),
        path: path.into(),
        mode: None,
    }
}

/// The Secret with the CA certificate and both movers' certificates and keys of one attempt.
pub fn attempt_secret(
    t: &Transfer,
    run: u32,
    attempt: u32,
    files: &BTreeMap<String, String>,
) -> Secret {
    let uid = t.metadata.uid.clone().unwrap_or_default();
    let data = files
        .iter()
        .map(|(k, v)| (k.clone(), ByteString(v.as_bytes().to_vec())))
        .collect();
    let mut labels = names::labels(&t.metadata.name.clone().unwrap_or_default(), &uid);
    labels.insert(LABEL_ATTEMPT.to_owned(), format!("{run}-{attempt}"));
    Secret {
        metadata: ObjectMeta {
            name: Some(names::secret_name(&uid, run, attempt)),
            namespace: t.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: owner_ref(t).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::transfer;

    /// A side on a hostPath `path` of `node`.
    fn host_path_on(node: &str, path: &str) -> SidePlacement {
        SidePlacement {
            volume: VolumeRef::HostPath { path: path.into() },
            sub_path: String::new(),
            node: Some(node.into()),
        }
    }

    fn args_of(p: &Pod) -> Vec<String> {
        p.spec.as_ref().expect("spec").containers[0]
            .args
            .clone()
            .unwrap_or_default()
    }

    #[test]
    fn a_fan_outs_sender_connects_to_each_destination_as_its_child() {
        let t = transfer();
        let cfg = Config::default();
        let placement = host_path_on("a", "/data");
        let serves = [
            Served {
                transfer_id: "c1.1".into(),
                ip: "10.0.0.1".into(),
            },
            Served {
                transfer_id: "c2.3".into(),
                ip: "10.0.0.2".into(),
            },
        ];
        let pod = mover_pod(&MoverPodInput {
            serves: &serves,
            ..MoverPodInput::new(&t, &cfg, MoverRole::Sender, (2, 1), &placement)
        });
        let args = args_of(&pod);
        let after = |flag: &str| -> Vec<&str> {
            args.windows(2)
                .filter(|w| w[0] == flag)
                .map(|w| w[1].as_str())
                .collect()
        };
        let port = cfg.data_port;
        assert_eq!(
            after("--connect"),
            [
                format!("c1.1@10.0.0.1:{port}"),
                format!("c2.3@10.0.0.2:{port}")
            ]
        );
        // Its certificate names the children only: it starts as the first.
        assert_eq!(after("--transfer"), ["c1.1"]);
        let annotations = pod.metadata.annotations.expect("annotations");
        assert_eq!(annotations[names::ANNOTATION_SERVES], "c1.1,c2.3");
        // The fan-out's pod, on the source's node, reading it.
        let uid = t.metadata.uid.clone().expect("uid");
        assert_eq!(
            pod.metadata.name,
            Some(names::pod_name(&uid, 2, 1, MoverRole::Sender))
        );
        assert_eq!(after("--connect-retry"), ["30"]);
        assert_eq!(after("--log-level"), ["info"], "it logs what it shared");
    }

    /// preserveOwnership (allowed by the operator) makes a root receiver that keeps owners and
    /// setuid/setgid bits; without it the receiver is neither root nor asked to.
    #[test]
    fn the_admins_labels_and_tolerations_hold_against_a_transfers_own() {
        let toleration = |key: &str, op: &str| Toleration {
            key: (!key.is_empty()).then(|| key.to_owned()),
            operator: Some(op.into()),
            ..Toleration::default()
        };
        let mut t = transfer();
        t.spec.mover = Some(crate::api::MoverSettings {
            labels: BTreeMap::from([
                ("team".to_owned(), "mine".to_owned()),
                ("extra".to_owned(), "x".to_owned()),
            ]),
            tolerations: Some(vec![toleration("gpu", "Exists"), toleration("", "Exists")]),
            ..Default::default()
        });
        let cfg = Config {
            extra_labels: BTreeMap::from([("team".to_owned(), "admins".to_owned())]),
            default_tolerations: vec![toleration("ferry.dev/movers", "Exists")],
            ..Config::default()
        };
        let placement = host_path_on("a", "/data");
        let pod = mover_pod(&MoverPodInput::new(
            &t,
            &cfg,
            MoverRole::Receiver,
            (1, 1),
            &placement,
        ));
        let labels = pod.metadata.labels.clone().expect("labels");
        assert_eq!(labels["team"], "admins", "the admin's label wins");
        assert_eq!(labels["extra"], "x");
        let keys: Vec<Option<String>> = pod
            .spec
            .and_then(|s| s.tolerations)
            .expect("tolerations")
            .into_iter()
            .map(|t| t.key)
            .collect();
        // The admin's stay, the Transfer's are added, a tolerate-everything one is dropped.
        assert_eq!(keys, [Some("ferry.dev/movers".into()), Some("gpu".into())]);
        let allowed = Config {
            default_priority_class: Some("movers".into()),
            allowed_priority_classes: vec!["batch-low".into()],
            ..Config::default()
        };
        assert!(
            allowed.priority_class_allowed("movers") && allowed.priority_class_allowed("batch-low")
        );
        assert!(!allowed.priority_class_allowed("system-cluster-critical"));
    }

    #[test]
    fn read_all_files_runs_a_sender_with_one_read_capability_and_nothing_else() {
        let mut t = transfer();
        t.spec.read_all_files = true;
        t.spec.on_unreadable = OnUnreadable::Skip;
        let placement = SidePlacement {
            volume: VolumeRef::HostPath {
                path: "/data".into(),
            },
            sub_path: "src".into(),
            node: Some("a".into()),
        };
        let pod = |cfg: &Config, role: MoverRole| {
            mover_pod(&MoverPodInput {
                receiver_ip: Some("10.1.2.3"),
                ..MoverPodInput::new(&t, cfg, role, (1, 1), &placement)
            })
        };
        let caps = |p: &Pod| {
            let c = &p.spec.as_ref().expect("spec").containers[0];
            let sc = c.security_context.clone().expect("security context");
            (
                sc.capabilities.and_then(|c| c.add).unwrap_or_default(),
                sc.run_as_non_root,
                p.spec
                    .as_ref()
                    .and_then(|s| s.security_context.as_ref())
                    .and_then(|s| s.run_as_user),
            )
        };
        let allowed = Config {
            allow_privileged_readers: true,
            ..Config::default()
        };
        let sender = pod(&allowed, MoverRole::Sender);
        assert_eq!(
            caps(&sender),
            (vec!["DAC_READ_SEARCH".to_owned()], Some(false), Some(0))
        );
        let c = &sender.spec.as_ref().expect("spec").containers[0];
        let data = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "data")
            .expect("data mount");
        assert_eq!(data.read_only, Some(true), "a reader's volume is read-only");
        let receiver = pod(&allowed, MoverRole::Receiver);
        let psc = receiver
            .spec
            .as_ref()
            .and_then(|s| s.security_context.clone());
        assert_eq!(
            psc.and_then(|p| p.fs_group_change_policy).as_deref(),
            Some("OnRootMismatch"),
            "no recursive re-own at every attempt"
        );
        assert!(args_of(&sender).join(" ").contains("--skip-unreadable"));
        // The receiver stays unprivileged; without the operator's permission nothing changes.
        assert_eq!(
            caps(&pod(&allowed, MoverRole::Receiver)),
            (vec![], Some(true), Some(65532))
        );
        assert_eq!(
            caps(&pod(&Config::default(), MoverRole::Sender)),
            (vec![], Some(true), Some(65532))
        );
    }

    #[test]
    fn preserved_ownership_runs_a_root_receiver_that_keeps_owners() {
        let mut t = transfer();
        let cfg = Config {
            allow_root_movers: true,
            ..Config::default()
        };
        let placement = SidePlacement {
            volume: VolumeRef::HostPath {
                path: "/data/dst".into(),
            },
            sub_path: String::new(),
            node: None,
        };
        let receiver = |t: &Transfer| {
            mover_pod(&MoverPodInput::new(
                t,
                &cfg,
                MoverRole::Receiver,
                (1, 1),
                &placement,
            ))
        };
        let plain = receiver(&t);
        assert!(!args_of(&plain).join(" ").contains("--owner"));
        t.spec.preserve_ownership = true;
        let root = receiver(&t);
        assert!(
            args_of(&root).join(" ").contains("--owner --special-bits"),
            "{:?}",
            args_of(&root)
        );
        let psc = root
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .expect("pod security context");
        assert_eq!(psc.run_as_user, Some(0));
    }

    #[test]
    fn receiver_pod_is_locked_down_and_pinned_to_its_node() {
        let t = transfer();
        let cfg = Config::default();
        let placement = host_path_on("node-b", "/data/dst");
        let pod = mover_pod(&MoverPodInput {
            use_block_store: true,
            ..MoverPodInput::new(&t, &cfg, MoverRole::Receiver, (1, 2), &placement)
        });
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.node_name, None, "never bypass the scheduler");
        assert_eq!(
            spec.node_selector.as_ref().expect("selector")[NODE_LABEL],
            "node-b"
        );
        let sc = spec.containers[0].security_context.as_ref().expect("sc");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_string()])
        );
        let psc = spec.security_context.as_ref().expect("psc");
        assert_eq!(psc.run_as_user, Some(65532));
        let args = args_of(&pod);
        assert!(args.contains(&"$(POD_IP):7400".to_string()), "{args:?}");
        let service = args
            .iter()
            .position(|a| a == "--block-service")
            .expect("--block-service");
        assert_eq!(args[service + 1], "ferry-node.ferry-system.svc:7443");
        assert_eq!(
            spec.volumes
                .iter()
                .flatten()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>(),
            ["data", "tls"],
            "a tenant's receiver mounts no block store"
        );
        assert!(!args.iter().any(|a| a.contains("0.0.0.0")));
        assert!(spec.containers[0].readiness_probe.is_some());
        assert_eq!(
            pod.metadata.owner_references.as_ref().expect("owner")[0].kind,
            "Transfer"
        );
    }

    #[test]
    fn a_fan_out_receiver_names_its_siblings_and_those_holding_the_tree() {
        let t = transfer();
        let cfg = Config::default();
        let placement = host_path_on("node-b", "/data/dst");
        let receiver = |swarm: &crate::plan::fan_out::Swarm| {
            args_of(&mover_pod(&MoverPodInput {
                swarm: Some(swarm),
                use_block_store: true,
                ..MoverPodInput::new(&t, &cfg, MoverRole::Receiver, (1, 1), &placement)
            }))
            .join(" ")
        };
        let mut swarm = crate::plan::fan_out::Swarm {
            peers: vec![
                "10.0.0.1:7443".into(),
                "10.0.0.2:7443".into(),
                String::new(),
            ],
            me: 1,
            complete: vec![],
        };
        let args = receiver(&swarm);
        assert!(
            args.contains("--swarm-peers 10.0.0.1:7443,10.0.0.2:7443, --swarm-self 1"),
            "{args}"
        );
        assert!(!args.contains("--swarm-complete"), "{args}");
        swarm.complete = vec![0, 2];
        assert!(receiver(&swarm).contains("--swarm-complete 0,2"));
    }

    #[test]
    fn sender_pod_connects_to_the_receiver_with_the_spec_flags() {
        let mut t = transfer();
        t.spec.delete_extraneous = true;
        t.spec.exclude = vec!["*.tmp".into(), "/cache/".into()];
        t.spec.bandwidth_limit = Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            "10M".into(),
        ));
        let cfg = Config::default();
        let placement = SidePlacement {
            volume: VolumeRef::Claim {
                claim: "data".into(),
            },
            sub_path: "sets/a".into(),
            node: None,
        };
        let pod = mover_pod(&MoverPodInput {
            receiver_ip: Some("10.1.2.3"),
            ..MoverPodInput::new(&t, &cfg, MoverRole::Sender, (1, 1), &placement)
        });
        let args = args_of(&pod).join(" ");
        assert!(args.contains("--connect 10.1.2.3:7400"), "{args}");
        assert!(
            args.contains("--root /ferry/data --sub-path sets/a"),
            "{args}"
        );
        assert!(args.contains("--delete"), "{args}");
        assert!(args.contains("--bandwidth-limit 10000000"), "{args}");
        assert!(args.contains("--exclude=*.tmp --exclude=/cache/"), "{args}");
        let vol = &pod
            .spec
            .as_ref()
            .expect("spec")
            .volumes
            .as_ref()
            .expect("vols")[0];
        assert_eq!(
            vol.persistent_volume_claim.as_ref().expect("pvc").read_only,
            Some(true)
        );
    }

    /// Streams and compression a Transfer leaves unset come from the operator's configuration;
    /// a Transfer's own values win.
    #[test]
    fn unset_streams_and_compression_take_the_operators_defaults() {
        let cfg = Config {
            default_streams: 9,
            default_compression: crate::api::Compression::Zstd,
            ..Config::default()
        };
        let placement = SidePlacement {
            volume: VolumeRef::Claim {
                claim: "data".into(),
            },
            sub_path: String::new(),
            node: None,
        };
        let sender_args = |t: &Transfer| {
            args_of(&mover_pod(&MoverPodInput {
                receiver_ip: Some("10.1.2.3"),
                ..MoverPodInput::new(t, &cfg, MoverRole::Sender, (1, 1), &placement)
            }))
            .join(" ")
        };
        let mut t = transfer();
        let args = sender_args(&t);
        assert!(args.contains("--streams 9 --compress zstd"), "{args}");
        t.spec.streams = Some(2);
        t.spec.compression = Some(crate::api::Compression::None);
        let args = sender_args(&t);
        assert!(args.contains("--streams 2 --compress none"), "{args}");
    }

    fn pull_secrets_of(p: &Pod) -> Vec<String> {
        p.spec
            .as_ref()
            .expect("spec")
            .image_pull_secrets
            .iter()
            .flatten()
            .map(|s| s.name.clone())
            .collect()
    }

    /// Every mover pod and the cleanup pod carry the operator's mover image pull Secrets, and
    /// no `imagePullSecrets` at all when none are configured.
    #[test]
    fn mover_and_cleanup_pods_carry_the_image_pull_secrets() {
        let t = transfer();
        let placement = SidePlacement {
            volume: VolumeRef::Claim {
                claim: "data".into(),
            },
            sub_path: String::new(),
            node: None,
        };
        let pods = |cfg: &Config| {
            let input = |role| MoverPodInput {
                receiver_ip: Some("10.1.2.3"),
                ..MoverPodInput::new(&t, cfg, role, (1, 1), &placement)
            };
            vec![
                mover_pod(&input(MoverRole::Receiver)),
                mover_pod(&input(MoverRole::Sender)),
                cleanup_pod(&input(MoverRole::Receiver)),
            ]
        };
        for pod in pods(&Config::default()) {
            assert_eq!(
                pod.spec.as_ref().expect("spec").image_pull_secrets,
                None,
                "{:?}",
                pod.metadata.name
            );
        }
        let cfg = Config {
            mover_image: "10.0.0.5:5000/ferry/ferry-mover:0.1.0".into(),
            mover_image_pull_secrets: vec!["regcred".into(), "mirror".into()],
            ..Config::default()
        };
        for pod in pods(&cfg) {
            assert_eq!(
                pull_secrets_of(&pod),
                ["regcred", "mirror"],
                "{:?}",
                pod.metadata.name
            );
            assert_eq!(
                pod.spec.as_ref().expect("spec").containers[0]
                    .image
                    .as_deref(),
                Some("10.0.0.5:5000/ferry/ferry-mover:0.1.0")
            );
        }
    }

    /// The built-in mover image names no registry host.
    #[test]
    fn default_mover_image_names_no_registry() {
        let image = Config::default().mover_image;
        assert_eq!(image, format!("ferry-mover:{}", env!("CARGO_PKG_VERSION")));
        assert!(!image.contains('/'), "{image}");
    }
}
