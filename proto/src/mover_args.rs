//! The command line the operator gives a mover pod, as one type. The operator builds a
//! [`MoverArgs`] and renders it ([`MoverArgs::to_args`]); `ferry-mover` parses the same words
//! with its own clap command line, and a test of the mover renders every option here and parses
//! it back, so a flag renamed on one side fails a test rather than a pod.

/// `ferry-mover send` or `ferry-mover receive`, with what both take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoverArgs {
    pub role: RoleArgs,
    pub common: CommonArgs,
}

/// What only a sender or only a receiver takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleArgs {
    Send(SendArgs),
    Receive(ReceiveArgs),
}

/// `ferry-mover receive`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReceiveArgs {
    /// `--listen` (the kubelet substitutes `$(POD_IP)`).
    pub listen: String,
    /// `--once`: exit after one session.
    pub once: bool,
    /// `--owner`: apply the sender's owner and group.
    pub owner: bool,
    /// `--special-bits`: keep setuid, setgid and sticky bits.
    pub special_bits: bool,
    /// `--block-service`: the node service's address.
    pub block_service: Option<String>,
    /// A fan-out child's place among its siblings' node services.
    pub swarm: Option<SwarmArgs>,
}

/// `--swarm-peers`, `--swarm-self`, `--swarm-complete`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SwarmArgs {
    pub peers: Vec<String>,
    pub me: usize,
    pub complete: Vec<usize>,
}

/// `ferry-mover send`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SendArgs {
    /// `--connect`, once per receiver: `HOST:PORT`, or `ID@HOST:PORT` for a session acting as
    /// transfer `ID` (a fan-out's sender).
    pub connect: Vec<String>,
    /// `--connect-retry` seconds.
    pub connect_retry: u64,
    /// `--streams`.
    pub streams: u32,
    /// `--compress`: `auto`, `zstd`, `lz4` or `none`.
    pub compress: String,
    /// `--delete`.
    pub delete: bool,
    /// `--checksum`.
    pub checksum: bool,
    /// `--skip-unreadable`.
    pub skip_unreadable: bool,
    /// `--exclude`, in order.
    pub exclude: Vec<String>,
    /// `--bandwidth-limit` in bytes per second.
    pub bandwidth_limit: Option<u64>,
}

/// What a sender and a receiver both take.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommonArgs {
    /// `--root`: the mounted volume.
    pub root: String,
    /// `--sub-path` beneath it.
    pub sub_path: Option<String>,
    /// `--transfer`.
    pub transfer: String,
    /// `--peer-ca` and `--peer-cluster` of a cross-cluster mover.
    pub peer: Option<PeerArgs>,
    /// `--ca`, `--cert`, `--key`.
    pub ca: String,
    pub cert: String,
    pub key: String,
    /// `--progress-listen`.
    pub progress_listen: String,
    /// `--progress-linger` seconds.
    pub progress_linger: u64,
    /// `--json`.
    pub json: bool,
    /// `--log-level`.
    pub log_level: Option<String>,
    /// `--sync`.
    pub sync: bool,
}

/// The other cluster of a cross-cluster mover: its CA bundle's path and its name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerArgs {
    pub ca: String,
    pub cluster: String,
}

/// The words of a command line, each flag with its value.
#[derive(Default)]
struct Words(Vec<String>);

impl Words {
    fn word(&mut self, w: &str) {
        self.0.push(w.to_owned());
    }

    fn flag(&mut self, name: &str, on: bool) {
        if on {
            self.word(name);
        }
    }

    fn value(&mut self, name: &str, value: impl ToString) {
        self.word(name);
        self.0.push(value.to_string());
    }

    fn maybe(&mut self, name: &str, value: Option<impl ToString>) {
        if let Some(v) = value {
            self.value(name, v);
        }
    }

    fn list<T: ToString>(&mut self, name: &str, values: &[T]) {
        let joined: Vec<String> = values.iter().map(T::to_string).collect();
        self.value(name, joined.join(","));
    }
}

impl MoverArgs {
    /// The container's `args`: the subcommand, its options, then what both roles take.
    pub fn to_args(&self) -> Vec<String> {
        let mut w = Words::default();
        match &self.role {
            RoleArgs::Receive(r) => r.render(&mut w),
            RoleArgs::Send(s) => s.render(&mut w),
        }
        self.common.render(&mut w);
        w.0
    }
}

impl ReceiveArgs {
    fn render(&self, w: &mut Words) {
        w.word("receive");
        w.value("--listen", &self.listen);
        w.flag("--once", self.once);
        w.flag("--owner", self.owner);
        w.flag("--special-bits", self.special_bits);
        w.maybe("--block-service", self.block_service.as_ref());
        if let Some(swarm) = &self.swarm {
            w.list("--swarm-peers", &swarm.peers);
            w.value("--swarm-self", swarm.me);
            if !swarm.complete.is_empty() {
                w.list("--swarm-complete", &swarm.complete);
            }
        }
    }
}

impl SendArgs {
    fn render(&self, w: &mut Words) {
        w.word("send");
        for c in &self.connect {
            w.value("--connect", c);
        }
        w.value("--connect-retry", self.connect_retry);
        w.value("--streams", self.streams);
        w.value("--compress", &self.compress);
        w.flag("--delete", self.delete);
        w.flag("--checksum", self.checksum);
        w.flag("--skip-unreadable", self.skip_unreadable);
        // One word each: a pattern that begins with `-` is still a pattern.
        for pattern in &self.exclude {
            w.word(&format!("--exclude={pattern}"));
        }
        w.maybe("--bandwidth-limit", self.bandwidth_limit);
    }
}

impl CommonArgs {
    fn render(&self, w: &mut Words) {
        w.value("--root", &self.root);
        w.maybe("--sub-path", self.sub_path.as_ref());
        w.value("--transfer", &self.transfer);
        if let Some(peer) = &self.peer {
            w.value("--peer-ca", &peer.ca);
            w.value("--peer-cluster", &peer.cluster);
        }
        w.value("--ca", &self.ca);
        w.value("--cert", &self.cert);
        w.value("--key", &self.key);
        w.value("--progress-listen", &self.progress_listen);
        w.value("--progress-linger", self.progress_linger);
        w.flag("--json", self.json);
        w.maybe("--log-level", self.log_level.as_ref());
        w.flag("--sync", self.sync);
    }
}
