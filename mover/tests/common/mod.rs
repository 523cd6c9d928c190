//! Shared helpers for the network tests: throwaway PKI, trees, in-process ends, comparisons.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_mover::net::{self, Role, TlsFiles};
use ferry_mover::progress::Progress;
use ferry_mover::session::{
    self, Compress, ReceiveError, ReceiverConfig, SenderConfig, SessionSummary, Timeouts,
};

pub mod node;

pub const BIN: &str = env!("CARGO_BIN_EXE_ferry-mover");

pub struct Pki {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    pub transfer: String,
}

pub fn pki(transfer: &str) -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let certs = net::generate_certs(transfer, 1).unwrap();
    net::write_certs(dir.path(), &certs).unwrap();
    Pki {
        path: dir.path().to_owned(),
        _dir: dir,
        transfer: transfer.to_owned(),
    }
}

impl Pki {
    /// Certificates as an operator issues them: `ca`'s, scoped to `cluster` and `attempt`.
    pub fn scoped(ca: &net::Ca, cluster: &str, transfer: &str, attempt: u32) -> Pki {
        Self::issued(ca, cluster, None, transfer, attempt)
    }

    /// The same for the movers of a cross-cluster Transfer: they name the `peer` cluster.
    pub fn scoped_for_peer(
        ca: &net::Ca,
        cluster: &str,
        peer: &str,
        transfer: &str,
        attempt: u32,
    ) -> Pki {
        Self::issued(ca, cluster, Some(peer), transfer, attempt)
    }

    /// As [`Pki::scoped`], the receiver's certificate stating `tenancy` at its node service
    /// (the operator's certificates state `namespace default, run test-run, shared store`
    /// otherwise: every test's fan-out destinations are siblings of one run).
    pub fn scoped_in(
        ca: &net::Ca,
        cluster: &str,
        transfer: &str,
        attempt: u32,
        tenancy: &net::Tenancy,
    ) -> Pki {
        Self::issued_in(ca, cluster, None, transfer, attempt, Some(tenancy))
    }

    /// As [`Pki::scoped`], the receiver's certificate stating no tenancy (as an operator that
    /// predates it issued them).
    pub fn issued_bare(ca: &net::Ca, cluster: &str, transfer: &str, attempt: u32) -> Pki {
        Self::issued_in(ca, cluster, None, transfer, attempt, None)
    }

    fn issued(
        ca: &net::Ca,
        cluster: &str,
        peer: Option<&str>,
        transfer: &str,
        attempt: u32,
    ) -> Pki {
        let tenancy =
            net::Tenancy::new(cluster, "default", "test-run", net::StoreScope::Shared).unwrap();
        Self::issued_in(ca, cluster, peer, transfer, attempt, Some(&tenancy))
    }

    fn issued_in(
        ca: &net::Ca,
        cluster: &str,
        peer: Option<&str>,
        transfer: &str,
        attempt: u32,
        tenancy: Option<&net::Tenancy>,
    ) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.cert_pem()).unwrap();
        for role in [Role::Sender, Role::Receiver, Role::Operator] {
            let id = match peer {
                Some(peer) => {
                    net::Identity::scoped_for_peer(transfer, role, cluster, attempt, peer)
                }
                None => net::Identity::scoped(transfer, role, cluster, attempt),
            }
            .unwrap();
            let (cert, key) = match tenancy {
                Some(t) if role == Role::Receiver => ca.issue_with_tenancy(&id, t).unwrap(),
                _ => ca.issue_for(&id).unwrap(),
            };
            std::fs::write(dir.path().join(format!("{role}.crt")), cert).unwrap();
            std::fs::write(dir.path().join(format!("{role}.key")), key).unwrap();
        }
        Pki {
            path: dir.path().to_owned(),
            _dir: dir,
            transfer: transfer.to_owned(),
        }
    }

    pub fn ca_path(&self) -> PathBuf {
        self.path.join("ca.crt")
    }

    pub fn files(&self, role: Role) -> TlsFiles {
        self.files_as(role, &self.transfer)
    }
    pub fn files_as(&self, role: Role, transfer: &str) -> TlsFiles {
        net::load_files(
            &self.path.join("ca.crt"),
            &self.path.join(format!("{role}.crt")),
            &self.path.join(format!("{role}.key")),
            transfer,
            role,
        )
        .unwrap()
    }
    pub fn args(&self, role: &str) -> Vec<String> {
        vec![
            "--ca".into(),
            self.path.join("ca.crt").display().to_string(),
            "--cert".into(),
            self.path.join(format!("{role}.crt")).display().to_string(),
            "--key".into(),
            self.path.join(format!("{role}.key")).display().to_string(),
            "--transfer".into(),
            self.transfer.clone(),
        ]
    }
}

pub fn write(path: &Path, data: &[u8]) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    std::fs::write(path, data).unwrap();
}

/// Deterministic pseudo-random bytes (incompressible).
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Small, large multi-block, empty file, empty dir, symlink, hard link, sparse, odd modes/mtimes.
pub fn mixed_tree(root: &Path) {
    write(&root.join("small.txt"), b"hello ferry\n");
    write(&root.join("empty"), b"");
    std::fs::create_dir_all(root.join("empty-dir")).unwrap();
    write(&root.join("dir/sub/deep.txt"), &b"text line\n".repeat(5000));
    for i in 0..300 {
        write(
            &root.join(format!("many/f{i:04}")),
            format!("file {i}\n").as_bytes(),
        );
    }
    // 3 blocks + a partial one.
    write(
        &root.join("big.bin"),
        &random_bytes(13 * 1024 * 1024 + 17, 1),
    );
    // A file just over the small-file threshold.
    write(&root.join("dir/mid.bin"), &random_bytes(1024 * 1024 + 1, 2));
    std::os::unix::fs::symlink("dir/sub/deep.txt", root.join("link")).unwrap();
    std::os::unix::fs::symlink("../../outside", root.join("dir/dangling")).unwrap();
    std::fs::hard_link(root.join("small.txt"), root.join("dir/hardlink")).unwrap();
    // Sparse: 12 MiB hole then data.
    let f = std::fs::File::create(root.join("sparse")).unwrap();
    f.set_len(12 * 1024 * 1024).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"end", 12 * 1024 * 1024).unwrap();
    drop(f);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        root.join("small.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::fs::set_permissions(root.join("dir/sub"), std::fs::Permissions::from_mode(0o750)).unwrap();
    let t = std::time::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    let f = std::fs::File::options()
        .write(true)
        .open(root.join("dir/sub/deep.txt"))
        .unwrap();
    f.set_modified(t).unwrap();
}

#[derive(Debug, PartialEq)]
pub struct Node {
    kind: char,
    mode: u32,
    mtime: (i64, i64),
    size: u64,
    content: Option<[u8; 32]>,
    target: Option<PathBuf>,
}

/// A comparable description of a tree (everything but the root's own entry and staging).
pub fn describe(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_owned();
            if rel.starts_with(".ferry-staging") {
                continue;
            }
            let md = std::fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let kind = if ft.is_dir() {
                stack.push(p.clone());
                'd'
            } else if ft.is_symlink() {
                'l'
            } else {
                'f'
            };
            let content =
                (kind == 'f').then(|| *blake3::hash(&std::fs::read(&p).unwrap()).as_bytes());
            out.insert(
                rel,
                Node {
                    kind,
                    mode: if kind == 'l' { 0 } else { md.mode() & 0o7777 },
                    mtime: (md.mtime(), md.mtime_nsec()),
                    size: if kind == 'd' { 0 } else { md.size() },
                    content,
                    target: (kind == 'l').then(|| std::fs::read_link(&p).unwrap()),
                },
            );
        }
    }
    out
}

pub fn assert_same_tree(src: &Path, dst: &Path) {
    let a = describe(src);
    let b = describe(dst);
    for (k, v) in &a {
        assert_eq!(Some(v), b.get(k), "entry {} differs", k.display());
    }
    assert_eq!(a.len(), b.len(), "destination has extra entries");
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    if src.join("dir/hardlink").exists() {
        assert_eq!(
            ino(&dst.join("small.txt")),
            ino(&dst.join("dir/hardlink")),
            "hard link kept"
        );
    }
}

pub fn fast_timeouts() -> Timeouts {
    Timeouts {
        progress: Duration::from_secs(30),
        handshake: Duration::from_secs(3),
        idle: Duration::from_secs(10),
    }
}

/// Starts an in-process receiver serving one session on 127.0.0.1:0.
pub async fn start_receiver(
    pki: &Pki,
    root: &Path,
) -> (
    SocketAddr,
    tokio::task::JoinHandle<Result<SessionSummary, String>>,
) {
    start_receiver_with_store(pki, root, None).await
}

/// Like [`start_receiver`], optionally with the node's block store.
pub async fn start_receiver_with_store(
    pki: &Pki,
    root: &Path,
    cas: Option<std::sync::Arc<ferry_mover::cas::CasStore>>,
) -> (
    SocketAddr,
    tokio::task::JoinHandle<Result<SessionSummary, String>>,
) {
    start_receiver_full(pki, root, cas, None, None, Default::default()).await
}

/// Like [`start_receiver`], using the node's block store service through `client`.
pub async fn start_receiver_with_service(
    pki: &Pki,
    root: &Path,
    client: ferry_mover::node::client::NodeStoreClient,
) -> (
    SocketAddr,
    tokio::task::JoinHandle<Result<SessionSummary, String>>,
) {
    start_receiver_full(pki, root, None, Some(client), None, Default::default()).await
}

/// Like [`start_receiver`], keeping the metadata `keep` names (`--owner`, `--special-bits`,
/// `--xattrs`).
pub async fn start_receiver_keep(
    pki: &Pki,
    root: &Path,
    keep: ferry_mover::session::Keep,
) -> (
    SocketAddr,
    tokio::task::JoinHandle<Result<SessionSummary, String>>,
) {
    start_receiver_full(pki, root, None, None, None, keep).await
}

/// Like [`start_receiver_with_service`], as one destination of a fan-out over `swarm`.
pub async fn start_receiver_in_fan_out(
    pki: &Pki,
    root: &Path,
    client: ferry_mover::node::client::NodeStoreClient,
    swarm: ferry_mover::node::swarm::SwarmPeers,
) -> (
    SocketAddr,
    tokio::task::JoinHandle<Result<SessionSummary, String>>,
) {
    let swarm = Some(Arc::new(swarm));
    start_receiver_full(pki, root, None, Some(client), swarm, Default::default()).await
}

async fn start_receiver_full(
    pki: &Pki,
    root: &Path,
    cas: Option<std::sync::Arc<ferry_mover::cas::CasStore>>,
    block_service: Option<ferry_mover::node::client::NodeStoreClient>,
    swarm: Option<Arc<ferry_mover::node::swarm::SwarmPeers>>,
    keep: ferry_mover::session::Keep,
) -> (
    SocketAddr,
    tokio::task::JoinHandle<Result<SessionSummary, String>>,
) {
    let files = pki.files(Role::Receiver);
    let server = Arc::new(net::server_config(&files, &[Role::Sender]).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = ReceiverConfig {
        root: root.to_owned(),
        transfer_id: pki.transfer.clone(),
        timeouts: fast_timeouts(),
        sync: false,
        cas,
        block_service,
        swarm,
        identity: Some(files.identity.clone()),
        keep,
        shutdown: ferry_mover::session::Shutdown::never(),
    };
    let h = tokio::spawn(async move {
        let progress = Arc::new(Progress::new(&cfg.transfer_id, "receiver"));
        let mut result: Option<Result<SessionSummary, String>> = None;
        let r = session::serve(
            listener,
            tokio_rustls::TlsAcceptor::from(server),
            cfg,
            true,
            progress,
            |r: &Result<SessionSummary, ReceiveError>| {
                result = Some(match r {
                    Ok(s) => Ok(s.clone()),
                    Err(e) => Err(session::error_chain(e)),
                });
            },
        )
        .await;
        match (r, result) {
            (_, Some(r)) => r,
            (Err(e), None) => Err(session::error_chain(&e)),
            (Ok(()), None) => Err("no session".into()),
        }
    });
    (addr, h)
}

#[derive(Clone)]
pub struct SendOpts {
    pub streams: u32,
    pub compress: Compress,
    pub delete: bool,
    pub checksum: bool,
    pub bandwidth_limit: Option<u64>,
    pub filter: std::sync::Arc<ferry_mover::tree::Filter>,
    /// Reads shared with the other sessions of one sender (a fan-out from one process).
    pub shared: Option<Arc<ferry_mover::session::sender::shared::SharedReads>>,
}

impl Default for SendOpts {
    fn default() -> Self {
        Self {
            streams: 2,
            compress: Compress::Auto,
            delete: false,
            checksum: false,
            bandwidth_limit: None,
            filter: Default::default(),
            shared: None,
        }
    }
}

pub async fn send(
    pki: &Pki,
    root: &Path,
    addr: SocketAddr,
    o: &SendOpts,
) -> Result<SessionSummary, String> {
    let progress = Arc::new(Progress::new(&pki.transfer, "sender"));
    send_watched(pki, root, addr, o, progress).await
}

/// [`send`] reporting into `progress`.
pub async fn send_watched(
    pki: &Pki,
    root: &Path,
    addr: SocketAddr,
    o: &SendOpts,
    progress: Arc<Progress>,
) -> Result<SessionSummary, String> {
    let files = pki.files(Role::Sender);
    let client = Arc::new(net::client_config(&files, &[Role::Receiver]).unwrap());
    let mut streams = Vec::new();
    for _ in 0..o.streams {
        streams.push(
            net::connect_tls(addr, client.clone(), Duration::from_secs(5))
                .await
                .map_err(|e| session::error_chain(&e))?,
        );
    }
    let cfg = SenderConfig {
        root: root.to_owned(),
        transfer_id: pki.transfer.clone(),
        compress: o.compress,
        delete: o.delete,
        checksum: o.checksum,
        sync: false,
        bandwidth_limit: o.bandwidth_limit,
        timeouts: fast_timeouts(),
        filter: o.filter.clone(),
        dry_run: false,
        on_unreadable: Default::default(),
        shutdown: ferry_mover::session::Shutdown::never(),
        shared: o.shared.clone(),
        source_file: None,
    };
    session::send_session(&cfg, streams, progress)
        .await
        .map_err(|e| session::error_chain(&e))
}

/// One in-process round trip: receiver up, send, both results.
pub async fn round_trip(
    pki: &Pki,
    src: &Path,
    dst: &Path,
    o: &SendOpts,
) -> (SessionSummary, SessionSummary) {
    let (addr, recv) = start_receiver(pki, dst).await;
    let sent = send(pki, src, addr, o).await.expect("send");
    let received = recv.await.unwrap().expect("receive");
    (sent, received)
}

/// Total size of the regular files under `root`.
/// Every regular file under `dir` (none if it does not exist), recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

pub fn tree_bytes(root: &Path) -> u64 {
    describe(root)
        .values()
        .filter(|n| n.kind == 'f')
        .map(|n| n.size)
        .sum()
}

/// The address a `receive` child prints as its first line, and the rest of its stdout.
/// `ferry-mover receive --listen 127.0.0.1:0 --once FLAGS --root DST` with the receiver's
/// certificates, started: the process, its bound address and the rest of its stdout.
pub fn spawn_receiver(
    pki: &Pki,
    dst: &Path,
    flags: &[&str],
) -> (
    std::process::Child,
    String,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut child = std::process::Command::new(BIN)
        .args(["receive", "--listen", "127.0.0.1:0", "--once"])
        .args(flags)
        .arg("--root")
        .arg(dst)
        .args(pki.args("receiver"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the receiver");
    let (addr, out) = bound_addr(&mut child);
    (child, addr, out)
}

/// `ferry-mover send --connect ADDR FLAGS --root SRC` with the sender's certificates, to the end.
pub fn run_sender(pki: &Pki, src: &Path, addr: &str, flags: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(["send", "--connect", addr])
        .args(flags)
        .arg("--root")
        .arg(src)
        .args(pki.args("sender"))
        .output()
        .expect("run the sender")
}

/// A memory figure of a process from `/proc/<pid>/status` (`VmHWM`, `VmRSS`, ...), in KiB;
/// None once the process is gone.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| {
        l.strip_prefix(field)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    line.split_whitespace().nth(1)?.parse().ok()
}

pub fn bound_addr(
    child: &mut std::process::Child,
) -> (String, std::io::BufReader<std::process::ChildStdout>) {
    use std::io::BufRead as _;
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout piped"));
    let mut addr = String::new();
    out.read_line(&mut addr).unwrap();
    (addr.trim().to_owned(), out)
}

/// A scripted sender's Hello: stream `stream_index` of `stream_count`, session id `session`.
pub fn hello(
    transfer: &str,
    caps: u64,
    session: Vec<u8>,
    stream_index: u32,
    stream_count: u32,
) -> ferry_proto::wire::v1::Hello {
    ferry_proto::wire::v1::Hello {
        version: ferry_mover::wire::PROTOCOL_VERSION,
        capabilities: caps,
        transfer_id: transfer.into(),
        session_id: session,
        stream_index,
        stream_count,
        block_size: ferry_mover::wire::BLOCK_SIZE as u32,
        filter_rules: Vec::new(),
    }
}

/// A scripted peer's two framed halves of `stream`, past Hello/Welcome (the Welcome returned).
pub async fn greet<S>(
    stream: S,
    idle: Duration,
    hello: ferry_proto::wire::v1::Hello,
) -> (
    session::FrameReader<tokio::io::ReadHalf<S>>,
    session::FrameWriter<tokio::io::WriteHalf<S>>,
    ferry_proto::wire::v1::Welcome,
)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    use ferry_mover::wire::Message;
    let (r, w) = tokio::io::split(stream);
    let mut reader = session::FrameReader::new(r, 0, idle, Default::default());
    let mut writer = session::FrameWriter::new(w, 0, idle, Default::default());
    writer.send(&Message::Hello(hello)).await.unwrap();
    writer.flush().await.unwrap();
    match reader.expect().await.unwrap() {
        Message::Welcome(welcome) => (reader, writer, welcome),
        other => panic!("expected Welcome, got {other:?}"),
    }
}

/// A TLS connection to `addr` with `pki`'s sender certificate, as a scripted peer.
pub async fn connect_as_sender(
    pki: &Pki,
    addr: SocketAddr,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let client = Arc::new(net::client_config(&pki.files(Role::Sender), &[Role::Receiver]).unwrap());
    net::connect_tls(addr, client, Duration::from_secs(5))
        .await
        .unwrap()
}

/// The uid (and gid) the unprivileged movers of the tests run as when the tests run as root.
pub const NOBODY: u32 = 65534;

/// `path`'s permission bits set to `mode`.
pub fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A command that runs the mover binary as an unprivileged uid, so permission bits apply to it:
/// as root (as in CI, where root reads and writes anything) through `setpriv` as nobody
/// (65534, no groups), otherwise as this user. The certificates of `pki` and each of `open` (the
/// temporary directories above the trees: tempdirs are 0700) are opened to every uid. Never
/// skips: without setpriv as root it panics, so CI cannot pass by skipping.
pub fn unprivileged_mover(pki: &Pki, open: &[&Path]) -> std::process::Command {
    chmod(&pki.path, 0o755);
    for f in std::fs::read_dir(&pki.path).unwrap() {
        chmod(&f.unwrap().path(), 0o644);
    }
    for dir in open {
        chmod(dir, 0o755);
    }
    if !rustix::process::geteuid().is_root() {
        return std::process::Command::new(BIN);
    }
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("running as root: setpriv (util-linux) is needed to run a mover as nobody");
    let mut cmd = std::process::Command::new(setpriv);
    let id = NOBODY.to_string();
    cmd.args(["--reuid", &id, "--regid", &id, "--clear-groups", "--"])
        .arg(BIN);
    cmd
}

/// Reads a mover's stderr lines until "progress service on ADDR"; the rest is collected in the
/// background and handed back by the returned thread, so the child never blocks on a full pipe.
pub fn progress_addr(
    child: &mut std::process::Child,
) -> (SocketAddr, std::thread::JoinHandle<String>) {
    use std::io::{BufRead as _, Read as _};
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let mut seen = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "no progress address: {seen}"
        );
        seen.push_str(&line);
        if let Some(addr) = line.trim().strip_prefix("progress service on ") {
            let addr = addr.parse().unwrap();
            let rest = std::thread::spawn(move || {
                let mut rest = String::new();
                let _ = err.read_to_string(&mut rest);
                rest
            });
            return (addr, rest);
        }
    }
}

/// Every update of one progress Watch (an operator's certificate), until the stream ends.
pub async fn watch_progress(
    pki: &Pki,
    addr: SocketAddr,
) -> Vec<ferry_proto::progress::v1::ProgressUpdate> {
    let tls = Arc::new(
        net::client_config(&pki.files(Role::Operator), &[Role::Sender, Role::Receiver]).unwrap(),
    );
    let mut client = ferry_mover::progress::connect_progress(addr, tls)
        .await
        .unwrap();
    let mut stream = client
        .watch(ferry_proto::progress::v1::ProgressRequest { interval_ms: 100 })
        .await
        .unwrap()
        .into_inner();
    let mut updates = Vec::new();
    while let Some(u) = stream.message().await.unwrap() {
        updates.push(u);
    }
    updates
}

/// The lines a child writes to stderr, read by a thread of their own (the child never blocks
/// on a full pipe); the channel closes when the child closes its stderr.
pub fn stderr_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead as _;
    let err = std::io::BufReader::new(child.stderr.take().expect("stderr piped"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a line matching `pred` among `lines` until `within` passed; every line seen up to
/// then (the matching one last) is appended to `seen`. `true` when one matched.
pub fn wait_for_line(
    lines: &std::sync::mpsc::Receiver<String>,
    within: Duration,
    seen: &mut String,
    pred: impl Fn(&str) -> bool,
) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if pred(&line) {
                    return true;
                }
            }
            Err(_) => return false,
        }
    }
}

/// Connections waiting in the accept queue of the IPv4 socket listening on `port` (the kernel
/// shows a listening socket's backlog as its rx_queue in /proc/net/tcp); `None` when no socket
/// listens there.
pub fn accept_backlog(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let want = format!(":{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // local_address, rem_address, st (0A = LISTEN), tx_queue:rx_queue
        let (local, state, queues) = (f.get(1)?, f.get(3)?, f.get(4)?);
        if !local.ends_with(&want) || *state != "0A" {
            return None;
        }
        u64::from_str_radix(queues.split(':').nth(1)?, 16).ok()
    })
}

/// Waits until the listener on `port` has accepted every connection made to it (its accept
/// queue is empty), for at most `within`; `true` when it did.
pub fn wait_until_accepted(port: u16, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if accept_backlog(port) == Some(0) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
