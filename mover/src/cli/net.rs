//! `ferry-mover certs|send|receive`.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::net::{self, Role, TransportError};
use crate::progress::{self, Phase, Progress};
use crate::report::ProgressBar;
use crate::session::sender::shared::SharedReads;
use crate::session::sender::start_gate::{StartGate, Ticket};
use crate::session::{self, Compress, ReceiverConfig, SenderConfig, SessionSummary, Timeouts};
use crate::tree::subpath::{self, Anchored, Side};
use ferry_proto::kind::{ErrorKind, Failure};

/// `--compress`: the library's [`Compress`], as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompressArg {
    Auto,
    Zstd,
    Lz4,
    None,
}

impl From<CompressArg> for Compress {
    fn from(a: CompressArg) -> Self {
        match a {
            CompressArg::Auto => Compress::Auto,
            CompressArg::Zstd => Compress::Zstd,
            CompressArg::Lz4 => Compress::Lz4,
            CompressArg::None => Compress::None,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct CertsArgs {
    /// Directory for ca.crt, {sender,receiver,operator}.{crt,key} (and node.{crt,key}).
    #[arg(long)]
    pub out: PathBuf,
    /// Transfer id the certificates are bound to.
    #[arg(long)]
    pub transfer: String,
    /// Validity in days.
    #[arg(long, default_value_t = 7)]
    pub days: u32,
    /// Issue the certificates as this cluster's operator does (attempt 1), and a node service
    /// certificate (node.crt, node.key) that admits them: for `node serve` and fan-out by hand.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Overwrite certificate and key files that exist already.
    #[arg(long)]
    pub force: bool,
}

/// TLS material and identity shared by send and receive.
#[derive(clap::Args, Debug)]
pub struct TlsArgs {
    /// CA certificate (PEM) that peers must chain to.
    #[arg(long)]
    pub ca: PathBuf,
    /// Own certificate (PEM), issued for this transfer and role.
    #[arg(long)]
    pub cert: PathBuf,
    /// Own private key (PEM).
    #[arg(long)]
    pub key: PathBuf,
    /// Transfer id; peers must present a certificate for the same id. Default: the id --cert
    /// was issued for.
    #[arg(long)]
    pub transfer: Option<String>,
    /// CA bundle (PEM) of the other cluster in a cross-cluster transfer, trusted only for that
    /// cluster's movers of this transfer and attempt (needs --peer-cluster and an
    /// operator-issued certificate).
    #[arg(long, requires = "peer_cluster")]
    pub peer_ca: Option<PathBuf>,
    /// Name of that cluster, as its certificates name it.
    #[arg(long, requires = "peer_ca")]
    pub peer_cluster: Option<String>,
    /// Serve the gRPC progress service on this address (mutual TLS, same CA).
    #[arg(long)]
    pub progress_listen: Option<SocketAddr>,
    /// With --progress-listen: after the outcome, stay up at most this many seconds until a
    /// progress client has received the final update.
    #[arg(long, default_value_t = 2)]
    pub progress_linger: u64,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
    /// Seconds allowed for the TLS handshake plus Hello/Welcome.
    #[arg(long, default_value_t = 10)]
    pub handshake_timeout: u64,
    /// Seconds a stream may stay silent before the session is aborted.
    #[arg(long, default_value_t = 60)]
    pub idle_timeout: u64,
    /// Seconds the peer may make no progress before the session is aborted: a receiver counts
    /// only frames that move the session; a sender also a receiver's Busy frames with a growing
    /// work counter. Keepalives and trickled bytes do not count.
    #[arg(long, default_value_t = 120)]
    pub progress_timeout: u64,
    /// fsync every file before it is renamed into place.
    #[arg(long)]
    pub sync: bool,
}

impl TlsArgs {
    fn timeouts(&self) -> Timeouts {
        Timeouts {
            handshake: Duration::from_secs(self.handshake_timeout.max(1)),
            idle: Duration::from_secs(self.idle_timeout.max(1)),
            progress: Duration::from_secs(self.progress_timeout.max(1)),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct SendArgs {
    /// Receiver address: HOST:PORT (a name or an IP; [v6]:PORT), or :PORT for this host.
    /// Repeat it to send the tree to several receivers at once (a fan-out): one session each,
    /// sharing the reads, so that every block of the source is read and hashed once.
    #[arg(long, required = true)]
    pub connect: Vec<String>,
    /// Tree to send (its contents land in the receiver's root), or a single file (it lands in
    /// the receiver's root under its own name).
    #[arg(long)]
    pub root: PathBuf,
    /// Send this directory (or file) beneath --root instead of --root itself: a relative path,
    /// resolved without following any symlink (a symlink on the way is refused).
    #[arg(long, value_name = "REL")]
    pub sub_path: Option<String>,
    /// Parallel TLS streams.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub streams: u32,
    /// Keep trying for this many seconds while the connection is refused, unreachable or
    /// unanswered (a receiver behind a Service or load balancer that is still being wired up; a
    /// network that does not admit this new pod yet); 0 fails at once.
    #[arg(long, default_value_t = 0)]
    pub connect_retry: u64,
    /// Per-block compression.
    #[arg(long, value_enum, default_value_t = CompressArg::Auto)]
    pub compress: CompressArg,
    /// Delete destination entries that are not in the source.
    #[arg(long)]
    pub delete: bool,
    /// Compare file contents (BLAKE3) instead of size and mtime to skip unchanged files.
    #[arg(long)]
    pub checksum: bool,
    /// Leave out source entries this mover may not read (permission denied), name each, and
    /// exit 1; without it such an entry fails the transfer at once (exit 21). The receiver
    /// keeps its copy of a left-out entry even with --delete.
    #[arg(long)]
    pub skip_unreadable: bool,
    /// Cap on bytes per second written to the network, over all streams: a quantity (`50M` =
    /// 50 000 000, `1Gi` = 2^30, as a Transfer's bandwidthLimit); 0 means no limit.
    #[arg(long, value_parser = crate::quantity::bandwidth_limit)]
    pub bandwidth_limit: Option<u64>,
    /// Ask the receiver what it would write and delete (listed there with -v/-i); send no
    /// data, change nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub filter: super::filter::FilterArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
}

#[derive(clap::Args, Debug)]
pub struct ReceiveArgs {
    /// Address to listen on: HOST:PORT (a name or an IP), or :PORT for every interface; port 0
    /// picks a free one. The bound address is the first line on stdout.
    #[arg(long)]
    pub listen: String,
    /// Destination root.
    #[arg(long)]
    pub root: PathBuf,
    /// Write into this directory beneath --root instead of --root itself: a relative path,
    /// resolved without following any symlink (a symlink on the way is refused); missing
    /// directories are created (mode 0755).
    #[arg(long, value_name = "REL")]
    pub sub_path: Option<String>,
    /// Exit after one session.
    #[arg(long)]
    pub once: bool,
    /// The node's block store: blocks it holds are taken from it instead of the wire (after the
    /// sender proves possession), verified blocks from the wire are added to it.
    #[arg(long)]
    pub cas: Option<PathBuf>,
    /// Cap of the block store in bytes (recorded in the store; least recently used blocks go).
    #[arg(long, requires = "cas")]
    pub cas_cap: Option<u64>,
    /// The node's block store service (`ferry-mover node serve`) at HOST:PORT, reached with
    /// this receiver's own certificate: the same dedup as --cas without mounting the store. When
    /// it cannot be reached the receiver goes on without dedup.
    #[arg(long, conflicts_with = "cas", value_name = "HOST:PORT")]
    pub block_service: Option<String>,
    /// Fan-out: the node services of every destination of the Transfer, in the same order on
    /// each (this receiver's own included, at --swarm-self). Each full block is asked of the
    /// sender by one destination only (chosen by its hash) and taken by the others from that
    /// destination's node service. An empty entry is a destination that does not receive now:
    /// it owns nothing, and its blocks come from the sender.
    #[arg(long, requires_all = ["block_service", "swarm_self"], value_delimiter = ',',
          value_name = "HOST:PORT,...")]
    pub swarm_peers: Vec<String>,
    /// This receiver's position in --swarm-peers.
    #[arg(long, requires = "swarm_peers")]
    pub swarm_self: Option<usize>,
    /// Positions in --swarm-peers of destinations that already hold the whole tree (they
    /// finished): blocks this receiver owns, and those of destinations listed empty, are taken
    /// from them instead of the sender.
    #[arg(
        long,
        requires = "swarm_peers",
        value_delimiter = ',',
        value_name = "I,..."
    )]
    pub swarm_complete: Vec<usize>,
    /// Seconds a fan-out peer may take to hand over a block it owns (it may still be receiving
    /// it) before this session fails; a retry resumes.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=120))]
    pub swarm_wait: u64,
    /// Seconds to wait for another receiver of the same destination (which holds its lock) to
    /// let go before failing: an earlier attempt's receiver may still be stopping.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub lock_wait: u64,
    /// Apply the sender's owner and group to what is written (needs root; refused otherwise).
    /// Without it everything belongs to the user running the receiver.
    #[arg(long)]
    pub owner: bool,
    /// Keep setuid, setgid and sticky bits as the sender sends them. Without it they are
    /// masked, so a sender cannot plant a setuid file.
    #[arg(long)]
    pub special_bits: bool,
    /// Apply the sender's user.* extended attributes to files and directories.
    #[arg(long)]
    pub xattrs: bool,
    #[command(flatten)]
    pub tls: TlsArgs,
}

pub fn run_certs(args: CertsArgs) -> anyhow::Result<ExitCode> {
    let certs = net::generate_certs_in(&args.transfer, args.days, args.cluster.as_deref())?;
    if !args.force {
        let mut names = vec!["ca.crt".to_owned()];
        for (role, _, _) in &certs.leaves {
            names.push(format!("{role}.crt"));
            names.push(format!("{role}.key"));
        }
        let existing: Vec<String> = names
            .iter()
            .map(|n| args.out.join(n))
            .filter(|p| p.symlink_metadata().is_ok())
            .map(|p| p.display().to_string())
            .collect();
        if !existing.is_empty() {
            anyhow::bail!(
                "refusing to overwrite {} (pass --force to replace them)",
                existing.join(", ")
            );
        }
    }
    let written = net::write_certs(&args.out, &certs)?;
    for p in written {
        eprintln!("wrote {}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `--ca`, `--cert`, `--key` for `role`, plus the peer cluster's CA when given.
fn load_tls(tls: &TlsArgs, transfer: &str, role: Role) -> anyhow::Result<net::TlsFiles> {
    let files = net::load_files(&tls.ca, &tls.cert, &tls.key, transfer, role)?;
    Ok(match (&tls.peer_ca, &tls.peer_cluster) {
        (Some(ca), Some(cluster)) => net::with_peer(files, ca, cluster)?,
        _ => files,
    })
}

/// `--transfer`, or the id the mover's own certificate was issued for.
fn transfer_id(tls: &TlsArgs) -> anyhow::Result<String> {
    match &tls.transfer {
        Some(t) => Ok(t.clone()),
        None => net::own_transfer_id(&tls.cert)
            .context("no --transfer given, and it cannot be read from --cert"),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")
}

/// A session's summary on stdout (`--json`) or stderr; `destination` names the receiver when a
/// sender had several (a `destination` field in JSON, "sent to ADDR" for people).
fn print_summary(
    json: bool,
    role: &str,
    destination: Option<&str>,
    s: &SessionSummary,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        match destination {
            None => serde_json::to_writer(&mut out, s)?,
            Some(addr) => {
                let mut line = serde_json::to_value(s)?;
                if let Some(fields) = line.as_object_mut() {
                    fields.insert("destination".into(), addr.into());
                }
                serde_json::to_writer(&mut out, &line)?;
            }
        }
        writeln!(out)?;
    } else if !crate::report::quiet() {
        let role = destination.map_or_else(|| role.to_owned(), |addr| format!("{role} to {addr}"));
        eprintln!("{role}: {}", human_summary(s));
        if let Some(line) = dropped_line(s) {
            eprintln!("{role}: dropped: {line}");
        }
    }
    out.flush()?;
    Ok(())
}

/// One line for people: what moved (and at what rate), what was already there, and how, in one
/// unit family (decimal, as the progress bar). The rate counts only bytes that crossed the
/// network: blocks from the block store and resumed blocks did not.
pub fn human_summary(s: &SessionSummary) -> String {
    use crate::report::decimal;
    if s.dry_run {
        return format!(
            "dry run, nothing changed: would write {} files ({}), {} unchanged, would delete {}; \
             {} failed",
            s.files,
            decimal(s.bytes as f64),
            s.skipped,
            s.deleted,
            s.failed
        );
    }
    let sent = s.bytes.saturating_sub(s.dedup_bytes);
    let mut line = format!(
        "wrote {} files, {} ({} sent at {}/s",
        s.files,
        decimal(s.bytes as f64),
        decimal(sent as f64),
        decimal(sent as f64 / s.seconds.max(1e-9)),
    );
    if s.dedup_blocks > 0 {
        line.push_str(&format!(
            ", {} in {} blocks from the block store",
            decimal(s.dedup_bytes as f64),
            s.dedup_blocks
        ));
    }
    line.push_str(&format!(") in {:.2} s", s.seconds));
    if s.resumed_bytes > 0 {
        line.push_str(&format!(
            "; {} already held from an interrupted run",
            decimal(s.resumed_bytes as f64)
        ));
    }
    line.push_str(&format!(
        "; {} unchanged; {} on the wire over {} streams; {} deleted; {} failed; digest {}",
        s.skipped,
        decimal(s.wire_bytes as f64),
        s.streams,
        s.deleted,
        s.failed,
        if s.digest.is_empty() { "-" } else { &s.digest }
    ));
    if s.unreadable > 0 {
        line.push_str(&format!("; {} unreadable, left out", s.unreadable));
    }
    line
}

/// What a receiver did not apply because it was not asked to, e.g. `3 setuid/setgid/sticky
/// bits (--special-bits), 12 xattrs (--xattrs)`; `None` when nothing was dropped.
fn dropped_line(s: &SessionSummary) -> Option<String> {
    let parts: Vec<String> = [
        (
            s.dropped_special_bits,
            "setuid/setgid/sticky bits",
            "--special-bits",
        ),
        (s.dropped_xattrs, "xattrs", "--xattrs"),
        (s.dropped_owners, "owners", "--owner"),
    ]
    .iter()
    .filter(|(n, _, _)| *n > 0)
    .map(|(n, what, flag)| format!("{n} {what} ({flag})"))
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// The receiver's first few failure messages on the sender's stderr (the receiver logged each
/// one itself), with how many more there were.
fn print_failures(role: &str, s: &SessionSummary) {
    for path in &s.unreadable_paths {
        eprintln!(
            "{role}: unreadable, left out: {}",
            session::escape_text(path)
        );
    }
    let more = s.unreadable.saturating_sub(s.unreadable_paths.len() as u64);
    if more > 0 {
        eprintln!("{role}: ... and {more} more unreadable entries (see the log)");
    }
    for msg in &s.failures {
        eprintln!("{role}: failed: {}", session::escape_text(msg));
    }
    let more = s.failed.saturating_sub(s.failures.len() as u64);
    if more > 0 {
        eprintln!("{role}: ... and {more} more failed entries (see the receiver's log)");
    }
}

/// Exit status 1 when entries were left out, though the rest was transferred.
fn exit_code(s: &SessionSummary) -> ExitCode {
    if s.left_out() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn start_progress_service(
    tls: &TlsArgs,
    files: &net::TlsFiles,
    progress: Arc<Progress>,
    sessions: BTreeMap<String, Arc<Progress>>,
) -> anyhow::Result<()> {
    if let Some(addr) = tls.progress_listen {
        let cfg = net::server_config(&files.local_only(), &[Role::Operator])?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("failed to bind progress address {addr}"))?;
        eprintln!("progress service on {}", listener.local_addr()?);
        tokio::spawn(async move {
            let served =
                progress::serve_progress_of_sessions(listener, Arc::new(cfg), progress, sessions);
            if let Err(e) = served.await {
                tracing::warn!("progress service stopped: {e}");
            }
        });
    }
    Ok(())
}

/// Keeps a mover with a progress port up until its outcome was read (see `--progress-linger`).
async fn linger(tls: &TlsArgs, progress: &Progress) {
    if tls.progress_listen.is_some() {
        progress
            .linger_for_watchers(Duration::from_secs(tls.progress_linger))
            .await;
    }
}

/// A failed session as the user sees it: `ferry-mover: error (<kind>[, permanent]): <message>`
/// on stderr and the exit status of its kind and permanence (docs/protocol.md, "Errors").
fn report_failure(failure: Failure, message: &str) -> ExitCode {
    // The message may carry the peer's words and paths: never raw control characters.
    eprintln!(
        "ferry-mover: error ({failure}): {}",
        session::escape_text(message)
    );
    ExitCode::from(failure.exit_status())
}

/// `--root` plus `--sub-path`, resolved and held open for the whole process; `Err` is the exit
/// status already reported (2 for a bad flag, the side's kind and permanence otherwise).
fn anchor(root: &std::path::Path, sub: Option<&str>, side: Side) -> Result<Anchored, ExitCode> {
    let resolved = subpath::parse(sub.unwrap_or("")).and_then(|rel| match side {
        Side::Source => subpath::open_source(root, rel.as_ref()),
        Side::Destination => subpath::open_destination(root, rel.as_ref()),
    });
    resolved.map_err(|e| {
        let kind = match e.side() {
            None => {
                eprintln!("ferry-mover: error: {}", session::error_chain(&e));
                return ExitCode::from(ferry_proto::kind::EXIT_OTHER);
            }
            Some(Side::Source) => ErrorKind::Source,
            Some(Side::Destination) => ErrorKind::Destination,
        };
        let failure = Failure::new(kind, e.permanent());
        report_failure(failure, &session::error_chain(&e))
    })
}

/// The destination's one-receiver lock, on the held sub path or on `--root` (a root that does not
/// exist yet is created by the session and has no other receiver to fear).
fn lock_destination(
    anchored: &Anchored,
    wait: Duration,
) -> Result<Option<crate::tree::dest_lock::DestLock>, crate::tree::dest_lock::LockError> {
    use crate::tree::dest_lock::{LockError, lock_destination_within as lock};
    match anchored.dir() {
        Some(fd) => lock(&fd, wait).map(Some),
        None => match std::fs::File::open(anchored.shown_dir()) {
            Ok(dir) => lock(&dir, wait).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(LockError::Io(e)),
        },
    }
}

/// Messages name `/proc/self/fd/<n>` where the mover works through its held handle: show
/// `--root`/`--sub-path` instead, as the user gave them.
#[derive(Debug, Clone)]
struct Shown {
    effective: String,
    shown: String,
}

impl Shown {
    fn of(a: &Anchored) -> Shown {
        Shown {
            effective: a.effective_dir().display().to_string(),
            shown: a.shown_dir().display().to_string(),
        }
    }
    fn text(&self, s: &str) -> String {
        s.replace(&self.effective, &self.shown)
    }
    fn summary(&self, s: &SessionSummary) -> SessionSummary {
        let mut s = s.clone();
        for f in &mut s.failures {
            *f = self.text(f);
        }
        s
    }
}

/// Exit status 0 when everything was sent and the digests agree, 1 when the receiver left
/// entries out (the first few reasons printed), 10-15 by kind when the session failed (the
/// receiver's reason when it gave one), 2 for failures before the session.
pub fn run_send(args: SendArgs) -> anyhow::Result<ExitCode> {
    let transfer = transfer_id(&args.tls)?;
    let files = load_tls(&args.tls, &transfer, Role::Sender)?;
    let targets = args
        .connect
        .iter()
        .map(|spec| Target::parse(spec, &files))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Target::check_each_transfer_once(&targets)?;
    let timeouts = args.tls.timeouts();
    let anchored = match anchor(&args.root, args.sub_path.as_deref(), Side::Source) {
        Ok(a) => a,
        Err(code) => return Ok(code),
    };
    let shown = Shown::of(&anchored);
    let mut cfg = SenderConfig {
        root: anchored.effective(),
        transfer_id: transfer.clone(),
        compress: args.compress.into(),
        delete: args.delete,
        checksum: args.checksum,
        sync: args.tls.sync,
        bandwidth_limit: args.bandwidth_limit.filter(|&bps| bps > 0),
        timeouts,
        filter: {
            let f = args.filter.compile()?;
            f.check_wire_size()?;
            f
        },
        dry_run: args.dry_run,
        on_unreadable: if args.skip_unreadable {
            session::OnUnreadable::Skip
        } else {
            session::OnUnreadable::Fail
        },
        // Set to the process's signals inside the runtime.
        shutdown: session::Shutdown::never(),
        shared: None,
        source_file: anchored.file().cloned(),
    };
    let destinations = targets.len();
    if destinations > 1 {
        cfg.shared = Some(Arc::new(SharedReads::new(destinations)));
    }
    // One destination acting as another of the certificate's Transfers is that Transfer's
    // sender through and through.
    let shown_transfer = match targets.as_slice() {
        [only] => only.files.identity.transfer_id.clone(),
        _ => transfer.clone(),
    };
    let progress = Arc::new(Progress::new(&shown_transfer, "sender"));
    let sessions: Vec<Arc<Progress>> = match destinations {
        1 => vec![progress.clone()],
        _ => targets
            .iter()
            .map(|t| Progress::for_session_as(&progress, &t.files.identity.transfer_id))
            .collect(),
    };
    let by_transfer = Target::sessions_by_transfer(&targets, &sessions);
    let rt = runtime()?;
    let outcomes = rt.block_on(async {
        cfg.shutdown = session::Shutdown::on_signals()?;
        start_progress_service(&args.tls, &files, progress.clone(), by_transfer.clone()).await?;
        let _bar = ProgressBar::start(progress.clone(), !args.tls.json);
        let mut addrs: Vec<SocketAddr> = Vec::with_capacity(destinations);
        for t in &targets {
            let addr = super::addr::resolve(&t.addr, "localhost").await?;
            // A second session to the same receiver would fail there (it serves one sender),
            // and a `--once` receiver would end after the first.
            if let Some(i) = addrs.iter().position(|a| *a == addr) {
                anyhow::bail!(
                    "--connect {} names the same receiver as --connect {} ({addr}): give \
                     each destination once",
                    t.spec,
                    targets[i].spec
                );
            }
            addrs.push(addr);
        }
        let destination = |t: &Target| {
            anyhow::Ok(Destination {
                cfg: SenderConfig {
                    transfer_id: t.files.identity.transfer_id.clone(),
                    ..cfg.clone()
                },
                client: Arc::new(net::client_config(&t.files, &[Role::Receiver])?),
                streams: args.streams,
                retry: Duration::from_secs(args.connect_retry),
            })
        };
        let outcomes = if destinations == 1 {
            vec![
                destination(&targets[0])?
                    .send(addrs[0], progress.clone(), None)
                    .await,
            ]
        } else {
            let mut runs = Vec::with_capacity(destinations);
            let wait = cfg.timeouts.handshake.min(cfg.timeouts.idle / 2);
            let tickets = StartGate::tickets(destinations, wait);
            for (((t, &addr), session), ticket) in
                targets.iter().zip(&addrs).zip(&sessions).zip(tickets)
            {
                let (destination, session) = (destination(t)?, session.clone());
                runs.push(async move {
                    let outcome = destination.send(addr, session.clone(), Some(ticket)).await;
                    session.close_session();
                    outcome
                });
            }
            progress.set_phase(Phase::Transferring);
            let outcomes = futures::future::join_all(runs).await;
            // The process's outcome: the first failed destination's, else the first that
            // left entries out, else success (with the digest every destination agreed on).
            match outcomes.iter().find_map(|o| o.as_ref().err()) {
                Some((failure, message)) => {
                    progress.set_failure(*failure, message);
                    progress.set_phase(Phase::Failed);
                }
                None => {
                    let summaries = outcomes.iter().filter_map(|o| o.as_ref().ok());
                    let mut telling = summaries.clone().filter(|s| s.failure_line().is_some());
                    if let Some(s) = telling.next().or(summaries.clone().next()) {
                        s.set_outcome(&progress);
                    }
                }
            }
            outcomes
        };
        if args.tls.progress_listen.is_some() {
            let keyed: Vec<Arc<Progress>> = by_transfer.values().cloned().collect();
            progress
                .linger_for_watchers_of(&keyed, Duration::from_secs(args.tls.progress_linger))
                .await;
        }
        anyhow::Ok(outcomes)
    })?;
    if let Some(shared) = &cfg.shared {
        let counts = shared.counts();
        tracing::info!(
            "{} blocks read from the source for {destinations} destinations ({} taken from \
             another destination's read)",
            counts.reads,
            counts.shared
        );
    }
    // The handle the sessions worked through stays open until here.
    drop(anchored);
    let mut code = ExitCode::SUCCESS;
    let mut failed = None;
    for (target, outcome) in targets.iter().zip(outcomes) {
        let addr = &target.spec;
        let named = |text: &str| match destinations {
            1 => text.to_owned(),
            _ => format!("to {addr}: {text}"),
        };
        match outcome {
            Ok(s) => {
                let summary = shown.summary(&s);
                let named_addr = (destinations > 1).then_some(addr.as_str());
                print_summary(args.tls.json, "sent", named_addr, &summary)?;
                print_failures(&named("sent"), &summary);
                if summary.left_out() {
                    code = exit_code(&summary);
                }
            }
            Err((failure, message)) => {
                let reported = report_failure(failure, &named(&shown.text(&message)));
                failed.get_or_insert(reported);
            }
        }
    }
    Ok(failed.unwrap_or(code))
}

/// One `--connect`: `[TRANSFER@]ADDR`, and the certificate identity the sender acts as there.
struct Target {
    /// As given, to name the destination in messages and summaries.
    spec: String,
    addr: String,
    /// The files acting as the Transfer named before `@` (else as the sender's own).
    files: net::TlsFiles,
    /// Whether a Transfer was named: its session is then reported under its id.
    named: bool,
}

impl Target {
    fn parse(spec: &str, files: &net::TlsFiles) -> anyhow::Result<Self> {
        let Some((transfer, addr)) = spec.split_once('@') else {
            return Ok(Self {
                spec: spec.to_owned(),
                addr: spec.to_owned(),
                files: files.clone(),
                named: false,
            });
        };
        let Some(acting) = files.acting_as(transfer) else {
            anyhow::bail!(
                "--connect {spec}: the certificate --cert does not speak for transfer {transfer:?} \
                 (it names {})",
                files.transfer_ids().join(", ")
            );
        };
        Ok(Self {
            spec: spec.to_owned(),
            addr: addr.to_owned(),
            files: acting,
            named: true,
        })
    }

    /// Each named Transfer has one destination: its operator reads one session under its id,
    /// and its receiver serves one sender session.
    fn check_each_transfer_once(targets: &[Target]) -> anyhow::Result<()> {
        for (i, t) in targets.iter().enumerate().filter(|(_, t)| t.named) {
            let id = &t.files.identity.transfer_id;
            if let Some(first) = targets[..i]
                .iter()
                .find(|o| o.named && o.files.identity.transfer_id == *id)
            {
                anyhow::bail!(
                    "--connect {} names transfer {id:?} again (as --connect {}): give each \
                     Transfer's destination once",
                    t.spec,
                    first.spec
                );
            }
        }
        Ok(())
    }

    /// The sessions of destinations that name their Transfer, by its id (each Transfer once,
    /// as `check_each_transfer_once` made sure).
    fn sessions_by_transfer(
        targets: &[Target],
        sessions: &[Arc<Progress>],
    ) -> BTreeMap<String, Arc<Progress>> {
        targets
            .iter()
            .zip(sessions)
            .filter(|(t, _)| t.named)
            .map(|(t, s)| (t.files.identity.transfer_id.clone(), s.clone()))
            .collect()
    }
}

type ClientStream = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// One receiver of a sender, and how to reach it.
struct Destination {
    cfg: SenderConfig,
    client: Arc<rustls::ClientConfig>,
    streams: u32,
    retry: Duration,
}

impl Destination {
    /// Connects every stream to `addr` and runs the session, starting with the other
    /// destinations' sessions (`ticket`). A destination that cannot be reached leaves the reads
    /// it would have shared to the others, and lets them start.
    async fn send(
        &self,
        addr: SocketAddr,
        progress: Arc<Progress>,
        ticket: Option<Ticket>,
    ) -> Result<SessionSummary, (Failure, String)> {
        let streams = match self.connect(addr).await {
            Ok(streams) => streams,
            Err(e) => {
                if let Some(shared) = &self.cfg.shared {
                    shared.leave();
                }
                let message = session::error_chain(&e);
                let failure = Failure::new(e.kind(), e.permanent());
                progress.set_failure(failure, &message);
                progress.set_phase(Phase::Failed);
                return Err((failure, message));
            }
        };
        session::send_session_gated(&self.cfg, streams, progress, ticket)
            .await
            .map_err(|e| (e.failure(), session::error_chain(&e)))
    }

    /// Opens every stream at once: the receiver's deadline for a connection's handshake and
    /// Hello starts when it accepts it, and the Hellos go only once all streams are open.
    async fn connect(&self, addr: SocketAddr) -> Result<Vec<ClientStream>, TransportError> {
        let timeout = self.cfg.timeouts.handshake;
        let connects = (0..self.streams)
            .map(|_| net::connect_tls_retrying(addr, self.client.clone(), timeout, self.retry));
        futures::future::try_join_all(connects).await
    }
}

/// Exit status 0 when every session succeeded, 1 when one left entries out (each logged); with
/// `--once`, 10-15 by kind when the session failed (the sender was told why).
pub fn run_receive(args: ReceiveArgs) -> anyhow::Result<ExitCode> {
    let euid = rustix::process::geteuid().as_raw();
    if args.owner && euid != 0 {
        anyhow::bail!(
            "--owner needs the receiver to run as root (euid 0); it runs as uid {euid}, so it \
             cannot give files to other owners"
        );
    }
    let transfer = transfer_id(&args.tls)?;
    let files = load_tls(&args.tls, &transfer, Role::Receiver)?;
    let server = Arc::new(net::server_config(&files, &[Role::Sender])?);
    let cas = match &args.cas {
        Some(dir) => {
            let opened = crate::cas::CasStore::open_with(
                dir,
                crate::cas::CasOptions {
                    cap_bytes: args.cas_cap,
                    fsync: args.tls.sync,
                },
            );
            match opened {
                Ok(store) => Some(Arc::new(store)),
                // A store fault, not a usage error: the operator retries without the store.
                Err(e) => {
                    let message = format!(
                        "failed to open block store {}: {}",
                        dir.display(),
                        session::error_chain(&e)
                    );
                    return Ok(report_failure(
                        Failure::new(ErrorKind::Store, false),
                        &message,
                    ));
                }
            }
        }
        None => None,
    };
    let anchored = match anchor(&args.root, args.sub_path.as_deref(), Side::Destination) {
        Ok(a) => a,
        Err(code) => return Ok(code),
    };
    let _lock = match lock_destination(&anchored, Duration::from_secs(args.lock_wait)) {
        Ok(lock) => lock,
        Err(e) => {
            let message = format!("{}: {e}", anchored.shown_dir().display());
            // Retryable: the other receiver may finish (or be a leftover about to be killed).
            return Ok(report_failure(
                Failure::new(ErrorKind::Destination, false),
                &message,
            ));
        }
    };
    let shown = Shown::of(&anchored);
    let mut cfg = ReceiverConfig {
        root: anchored.effective(),
        transfer_id: transfer.clone(),
        timeouts: args.tls.timeouts(),
        sync: args.tls.sync,
        cas,
        block_service: None,
        swarm: None,
        identity: Some(files.identity.clone()),
        keep: crate::session::Keep {
            owner: args.owner,
            special_bits: args.special_bits,
            xattrs: args.xattrs,
        },
        // Set to the process's signals inside the runtime.
        shutdown: session::Shutdown::never(),
    };
    let progress = Arc::new(Progress::new(&transfer, "receiver"));
    let rt = runtime()?;
    let json = args.tls.json;
    let failed = std::cell::Cell::new(false);
    let transfer_id = transfer.clone();
    let served = rt.block_on(async {
        cfg.shutdown = session::Shutdown::on_signals()?;
        if let Some(addr) = &args.block_service {
            cfg.block_service = connect_block_service(addr, &files).await;
        }
        match args.swarm_self {
            Some(me) if cfg.block_service.is_some() => {
                let wait = Duration::from_secs(args.swarm_wait);
                let peers = crate::node::swarm::SwarmPeers::connect(
                    &args.swarm_peers,
                    me,
                    &args.swarm_complete,
                    &files,
                    wait,
                )
                .await?;
                cfg.swarm = Some(Arc::new(peers));
            }
            Some(_) => tracing::warn!(
                "fan-out off: without this node's block store service every block comes from \
                 the source"
            ),
            None => {}
        }
        let listen = super::addr::resolve(&args.listen, "0.0.0.0").await?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("failed to listen on {listen} ({})", args.listen))?;
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", listener.local_addr()?)?;
            out.flush()?;
        }
        start_progress_service(&args.tls, &files, progress.clone(), BTreeMap::new()).await?;
        let _bar = ProgressBar::start(progress.clone(), !json);
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let served =
            session::serve(
                listener,
                acceptor,
                cfg,
                args.once,
                progress.clone(),
                |r| match r {
                    Ok(s) => {
                        if let Err(e) = print_summary(json, "received", None, &shown.summary(s)) {
                            tracing::warn!("failed to print summary: {e}");
                        }
                        if s.failed > 0 {
                            failed.set(true);
                        }
                    }
                    Err(_) => failed.set(true),
                },
            )
            .await;
        if args.once {
            linger(&args.tls, &progress).await;
        }
        anyhow::Ok(served)
    })?;
    if let Err(e) = served {
        let message = match &e {
            session::ListenError::Session(e) => session::failure_message(e, &transfer_id),
            e => session::error_chain(e),
        };
        return Ok(report_failure(e.failure(), &shown.text(&message)));
    }
    drop(anchored);
    Ok(if failed.get() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The node's block store service, or `None` (logged) when it cannot be reached in time: the
/// store is a cache, so the transfer goes on without dedup.
async fn connect_block_service(
    addr: &str,
    files: &net::TlsFiles,
) -> Option<crate::node::client::NodeStoreClient> {
    match crate::node::client::NodeStoreClient::connect(addr, files).await {
        Ok(c) => {
            tracing::info!(service = addr, "using the node's block store service");
            Some(c)
        }
        Err(e) => {
            tracing::warn!(
                "block store service unavailable, receiving without dedup: {}",
                session::error_chain(&e)
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_counts_only_what_crossed_the_network() {
        let s = SessionSummary {
            files: 3,
            bytes: 20_000_000,
            dedup_bytes: 16_000_000,
            dedup_blocks: 4,
            resumed_bytes: 8_000_000,
            wire_bytes: 4_100_000,
            seconds: 2.0,
            streams: 4,
            skipped: 7,
            ..SessionSummary::default()
        };
        let line = human_summary(&s);
        assert!(
            line.starts_with(
                "wrote 3 files, 20.0 MB (4.0 MB sent at 2.0 MB/s, 16.0 MB in 4 blocks from the \
                 block store) in 2.00 s; 8.0 MB already held from an interrupted run; 7 unchanged; \
                 4.1 MB on the wire over 4 streams"
            ),
            "{line}"
        );
        let unchanged = SessionSummary {
            skipped: 16,
            seconds: 0.01,
            ..SessionSummary::default()
        };
        assert!(
            human_summary(&unchanged).starts_with("wrote 0 files, 0 B (0 B sent at 0 B/s) in"),
            "{}",
            human_summary(&unchanged)
        );
    }
}
