//! Fan-out: the receivers of one Transfer with many destination nodes share what each got from
//! the source. Every full block has one owner among the destinations (chosen by its place in the
//! tree, so all agree without talking), and only the owner asks the sender for it; every other
//! destination answers the sender's announce "not needed" and takes the block from the owner's
//! node service as soon as it is there (a `Take` that waits). The source so sends about one copy
//! of the dataset whatever the number of destinations, and each destination's link carries one
//! copy in and about one copy out.
//!
//! The blocks come with the sender's proofs of possession for this receiver's stream, so an
//! owner's service hands out only what the asking receiver was announced. Each block is hashed
//! here before it is written. A peer that cannot be reached when the session starts owns
//! nothing (its blocks come from the source). One that fails later (it does not deliver in
//! time, its service goes away, or a Take of it exceeds its budget of time and bytes: see
//! [`take_budget`]) owns nothing from then on either, and the blocks left to it
//! become [`Orphans`]: with the refetch capability the receiver asks the sender for them once
//! the rest of the data is in, so a failed destination costs its siblings no retry. A sender
//! without it leaves the old answer: the session fails (retryable), and the retry resumes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::client::NodeStoreClient;
use crate::cas::dedup::AnnouncedBlock;
use crate::cas::pop::PopKey;
use crate::net::TlsFiles;

/// Fetch threads per session (each holds at most one block here).
const MAX_FETCHES: usize = 32;
/// How long a Take waits on a destination that holds the whole tree ([`SwarmPeers::wait_for`]).
const HOLDER_WAIT: Duration = Duration::from_secs(2);
/// Fetch threads taking from one peer at once, at least and at most: see [`fetches_per_peer`].
const MIN_FETCHES_PER_PEER: usize = 4;
const MAX_FETCHES_PER_PEER: usize = 10;
/// Blocks a session may leave to its peers at once (64 GiB of data, about 1.2 MiB of
/// bookkeeping); beyond it, blocks come from the source instead.
const MAX_OWED_BLOCKS: usize = 16384;
/// How long a Take waits for a pack of small files (at most; `--swarm-wait` when shorter). A
/// pack exists only where a destination asked for every small file of its Offer: a sibling that
/// held some of them already (a node that had the dataset before a file was added) never makes
/// it. The owner of a pack that is coming has it within seconds (packs flow at the links' rate,
/// a few MiB behind), so waiting longer only delays the first packs of such a sibling.
const PACK_WAIT: Duration = Duration::from_secs(30);
/// What one Take from a peer may take beyond the wait it was given, as one deadline on the
/// whole Take (a deadline per message a peer could meet for ever, one repeated block at a
/// time): [`TAKE_MARGIN`], and [`TAKE_MARGIN_PER_BLOCK`] for each block asked, 4 MiB in 5 s,
/// so that [`MAX_FETCHES`] Takes at once still fit a link of about 200 Mbit/s.
const TAKE_MARGIN: Duration = Duration::from_secs(10);
const TAKE_MARGIN_PER_BLOCK: Duration = Duration::from_secs(5);

/// What a Take of `blocks` blocks that waits up to `wait` may cost before its peer counts as
/// failed: the time (see [`TAKE_MARGIN`]) and the bytes. An honest peer sends each block asked
/// at most once; a repeat is skipped, and one is allowed (each position once plus one repeat,
/// each at most a full block), but a peer that answered a Take with one valid block over and
/// over kept a receiver from ever finishing.
fn take_budget(wait: Duration, blocks: usize) -> (Duration, u64) {
    let time = wait + TAKE_MARGIN + TAKE_MARGIN_PER_BLOCK * blocks as u32;
    let bytes = (blocks as u64 + 1) * crate::cas::BLOCK_SIZE as u64;
    (time, bytes)
}

/// Fetch threads that may take from one peer at once in a fan-out to `destinations`: an equal
/// share of [`MAX_FETCHES`], so a peer that lags (its own share of the source comes slowly)
/// holds only its share, never the threads that would take from the others.
///
/// More than a few per peer pay: more Takes outstanding at each owner keep this destination's
/// inbound link busier while the source still sends (a fan-out to 4 nodes measured 1.29x the
/// time to one node with 4 per peer, 1.19x with 10; docs/benchmarks.md). The cost is memory:
/// each fetch holds a block in flight here and one in the owner's service, which is why the
/// total stays [`MAX_FETCHES`] however many peers there are.
fn fetches_per_peer(destinations: usize) -> usize {
    (MAX_FETCHES / destinations.saturating_sub(1).max(1))
        .clamp(MIN_FETCHES_PER_PEER, MAX_FETCHES_PER_PEER)
}

/// The destinations of one fan-out, as every one of its receivers sees them.
#[derive(Debug)]
pub struct SwarmPeers {
    /// One entry per destination, in the order all destinations were given; `None` for this
    /// receiver's own and for a peer that could not be reached.
    peers: Vec<Option<(String, NodeStoreClient)>>,
    me: usize,
    /// How long a fetch waits for the owner to receive a block before this session fails.
    wait: Duration,
    /// Reachable destinations that already hold the whole tree in their stores (they finished):
    /// the blocks whose owner is this receiver or does not receive are taken from them.
    holders: Vec<usize>,
    /// The runtime the connections were made on (fetch threads wait on it).
    runtime: tokio::runtime::Handle,
}

/// Where consecutive blocks of the file at `path` start among the destinations.
fn path_start(path: &[u8]) -> u64 {
    let h = blake3::hash(path);
    let b = h.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Whom destination `me` takes a block from, given its owner `owner` (`receives`: the owner is
/// reachable and receives). The owner, when it is another destination that receives; else one
/// of the `holders` (destinations that finished and hold the whole tree), picked by `spread` so
/// they share the load; else nobody, and the sender sends it. So a destination that starts
/// after others finished (a fan-out run one node at a time under the operator's limits) takes
/// from them what the source would otherwise send again.
fn take_from(
    owner: usize,
    me: usize,
    receives: bool,
    holders: &[usize],
    spread: u64,
) -> Option<usize> {
    if owner != me && receives {
        return Some(owner);
    }
    (!holders.is_empty()).then(|| holders[(spread % holders.len() as u64) as usize])
}

#[derive(Debug, thiserror::Error)]
pub enum SwarmError {
    #[error("--swarm-self {me} is not an index into the {n} --swarm-peers")]
    SelfOutOfRange { me: usize, n: usize },
    #[error(
        "--swarm-complete {c} is not another destination's index into the {n} --swarm-peers (this one is {me})"
    )]
    CompleteOutOfRange { c: usize, me: usize, n: usize },
    #[error("--swarm-wait must be between 1 s and 120 s")]
    Wait,
}

impl SwarmPeers {
    /// Connects to every peer's node service but this receiver's own (`addrs[me]`). A peer that
    /// cannot be reached is logged and left out: the blocks it would own come from the source.
    /// So is an empty entry, a destination that does not receive now (the operator's word for
    /// a sibling that failed or waits in its queue), without a warning. `complete` are the
    /// destinations that already hold the whole tree (see [`Self::owner`]).
    pub async fn connect(
        addrs: &[String],
        me: usize,
        complete: &[usize],
        files: &TlsFiles,
        wait: Duration,
    ) -> Result<Self, SwarmError> {
        if me >= addrs.len() {
            return Err(SwarmError::SelfOutOfRange { me, n: addrs.len() });
        }
        if let Some(&c) = complete.iter().find(|&&c| c >= addrs.len() || c == me) {
            return Err(SwarmError::CompleteOutOfRange {
                c,
                me,
                n: addrs.len(),
            });
        }
        if wait < Duration::from_secs(1) || wait > super::service::MAX_TAKE_WAIT {
            return Err(SwarmError::Wait);
        }
        let connects = addrs.iter().enumerate().map(|(i, addr)| async move {
            if i == me {
                return None;
            }
            if addr.is_empty() {
                tracing::info!(
                    destination = i,
                    "fan-out destination not receiving now: the blocks it would own come from \
                     the source"
                );
                return None;
            }
            match NodeStoreClient::connect(addr, files).await {
                Ok(c) => Some((addr.clone(), c)),
                Err(e) => {
                    tracing::warn!(
                        peer = %addr, error = %crate::session::error_chain(&e),
                        "fan-out peer unreachable: the blocks it would own come from the source"
                    );
                    None
                }
            }
        });
        let peers: Vec<_> = futures::future::join_all(connects).await;
        let mut holders: Vec<usize> = complete
            .iter()
            .copied()
            .filter(|&c| peers[c].is_some())
            .collect();
        holders.sort_unstable();
        holders.dedup();
        Ok(Self {
            peers,
            me,
            wait,
            holders,
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// The destination that owns block `index` of the file whose [`path_start`] is `start`: the
    /// same answer on every destination. Consecutive blocks of a file go to consecutive
    /// destinations (from the start the path's hash picks), so every destination owns an equal
    /// share of a large file, give or take one block. A share chosen by each block's hash
    /// instead varies by about `sqrt(blocks / N)` blocks, and the destination with the largest
    /// share is the last to get its blocks from the source and must then pass them on to all
    /// the others alone.
    fn owner_index(&self, start: u64, index: u64) -> usize {
        let n = self.peers.len() as u64;
        ((start % n + index % n) % n) as usize
    }

    /// The peer to take block `index` of `path` from, or `None` when this receiver asks the
    /// sender for it: see [`take_from`].
    pub fn owner(&self, path: &[u8], index: u64) -> Option<usize> {
        let start = path_start(path);
        let i = self.owner_index(start, index);
        let spread = start.wrapping_add(index);
        take_from(i, self.me, self.peers[i].is_some(), &self.holders, spread)
    }

    /// How long a Take from `peer` waits for a block it does not hold yet: a destination that
    /// holds the whole tree has every block or never will (its store evicted one), so it is
    /// not waited for.
    fn wait_for(&self, peer: usize) -> Duration {
        if self.holders.contains(&peer) {
            HOLDER_WAIT
        } else {
            self.wait
        }
    }

    pub fn destinations(&self) -> usize {
        self.peers.len()
    }
}

/// Where a fetched block goes: written at its offset and recorded (a large file's staging).
pub trait FetchSink: Send + Sync + 'static {
    /// `block` was verified against `announced.hash`.
    fn deliver(&self, announced: &AnnouncedBlock, block: bytes::Bytes) -> Result<(), String>;
    /// The session's id of the file the blocks belong to.
    fn file_id(&self) -> u64;
    /// Its path in the tree, as the sender offered it.
    fn path(&self) -> &[u8];
    /// For a pack (one block holding several small files), the paths of its files in the
    /// pack's order: what a Refetch names when its owner does not deliver it.
    fn pack_paths(&self) -> Option<&[crate::tree::peer_path::PeerPath]> {
        None
    }
}

/// Blocks of one file that were left to a peer and that it did not deliver: the sender must
/// send them after all.
pub struct Orphans {
    pub sink: std::sync::Arc<dyn FetchSink>,
    pub blocks: Vec<AnnouncedBlock>,
}

/// Why a fetch stopped: the peer (its blocks can come from the source instead), the peer did
/// not have them within the wait, or this end (writing a block failed: the session fails
/// whatever the peers do).
enum FetchError {
    Peer(String),
    Late(String),
    Local(String),
}

/// Blocks of one announce one peer owns, to be taken from it.
struct Job {
    owner: usize,
    key: PopKey,
    blocks: Vec<AnnouncedBlock>,
    sink: std::sync::Arc<dyn FetchSink>,
}

#[derive(Default)]
struct Queue {
    /// Fetch threads allowed per owner ([`fetches_per_peer`]).
    per_peer: usize,
    /// Jobs waiting, per owner.
    jobs: BTreeMap<usize, VecDeque<Job>>,
    /// Fetch threads running, in all and per owner they are taking from.
    running: usize,
    running_for: BTreeMap<usize, usize>,
    /// Blocks admitted and not yet fetched (queued or being fetched).
    owed: usize,
    /// Peers that failed a fetch: they own nothing from then on.
    failed: std::collections::BTreeSet<usize>,
    /// Peers that did not deliver a pack in time: they own no pack from then on (they may not
    /// be making the same packs), and still their blocks.
    no_packs: std::collections::BTreeSet<usize>,
    /// Blocks failed peers did not deliver.
    orphans: Vec<Orphans>,
}

impl Queue {
    /// An owner with jobs waiting and fewer than `per_peer` threads on it.
    fn next_owner(&self) -> Option<usize> {
        self.jobs
            .iter()
            .find(|(o, j)| {
                !j.is_empty() && self.running_for.get(o).copied().unwrap_or(0) < self.per_peer
            })
            .map(|(o, _)| *o)
    }

    /// Takes a job of `owner`'s for a thread that works on it.
    fn take_for(&mut self, owner: usize) -> Option<Job> {
        let job = self.jobs.get_mut(&owner)?.pop_front()?;
        *self.running_for.entry(owner).or_default() += 1;
        Some(job)
    }

    fn done_with(&mut self, job: &Job) {
        self.owed -= job.blocks.len();
        if let Some(n) = self.running_for.get_mut(&job.owner) {
            *n -= 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.jobs.values().all(VecDeque::is_empty)
    }
}

/// One session's fetches from peers: admitted up to a bound, run on at most [`MAX_FETCHES`]
/// threads, counted, and waited for before the session's directory metadata and digest.
///
/// Nothing here ever blocks the session's streams: a stream that waited for a peer would stop
/// reading the blocks this destination owns, which the peers wait for in turn.
pub struct Fetches {
    peers: std::sync::Arc<SwarmPeers>,
    /// The sender sends blocks a failed peer did not deliver (refetch capability); without it a
    /// failed peer fails the session.
    refetch: bool,
    queue: Mutex<Queue>,
    idle: Condvar,
    failure: Mutex<Option<String>>,
    pub blocks: AtomicU64,
    pub bytes: AtomicU64,
}

impl Fetches {
    pub fn new(peers: std::sync::Arc<SwarmPeers>, refetch: bool) -> Self {
        let per_peer = fetches_per_peer(peers.destinations());
        Self {
            peers,
            refetch,
            queue: Mutex::new(Queue {
                per_peer,
                ..Queue::default()
            }),
            idle: Condvar::new(),
            failure: Mutex::new(None),
            blocks: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// The peer to take block `index` of `path` from ([`SwarmPeers::owner`]), unless that
    /// peer failed in this session: then the block comes from the source.
    pub fn owner(&self, path: &[u8], index: u64) -> Option<usize> {
        let owner = self.peers.owner(path, index)?;
        let q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        (!q.failed.contains(&owner)).then_some(owner)
    }

    /// The peer to take the pack whose first file is at `path` from: the owner of its block 0,
    /// unless that peer failed or did not deliver a pack in time in this session.
    pub fn pack_owner(&self, path: &[u8]) -> Option<usize> {
        let owner = self.peers.owner(path, 0)?;
        let q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        (!q.failed.contains(&owner) && !q.no_packs.contains(&owner)).then_some(owner)
    }

    /// The first failure of a fetch, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many of `n` more blocks may be left to peers (reserved): at most
    /// [`MAX_OWED_BLOCKS`] are owed at once. The others come from the source.
    pub fn admit(&self, n: usize) -> usize {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let room = MAX_OWED_BLOCKS.saturating_sub(q.owed).min(n);
        q.owed += room;
        room
    }

    /// Queues the admitted blocks, each with the peer that owns it (from [`SwarmPeers::owner`]),
    /// one job per owner, and starts fetch threads up to [`MAX_FETCHES`]. Every block is handed
    /// to `sink` once verified.
    pub fn start(
        self: &std::sync::Arc<Self>,
        key: &PopKey,
        owed: Vec<(usize, AnnouncedBlock)>,
        sink: std::sync::Arc<dyn FetchSink>,
    ) {
        let mut by_owner: BTreeMap<usize, Vec<AnnouncedBlock>> = BTreeMap::new();
        for (owner, a) in owed {
            by_owner.entry(owner).or_default().push(a);
        }
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        for (owner, blocks) in by_owner {
            q.jobs.entry(owner).or_default().push_back(Job {
                owner,
                key: key.clone(),
                blocks,
                sink: sink.clone(),
            });
        }
        // A new thread for each job no running thread may take, up to the bounds.
        while q.running < MAX_FETCHES
            && let Some(owner) = q.next_owner()
            && let Some(job) = q.take_for(owner)
        {
            q.running += 1;
            let this = self.clone();
            self.peers.runtime.spawn_blocking(move || this.work(job));
        }
    }

    /// A fetch thread: runs `job`, then any job of an owner with room, until there is none.
    fn work(&self, mut job: Job) {
        loop {
            // After a fatal failure the session fails anyway: the rest is not fetched.
            let pack = job.sink.pack_paths().is_some();
            let failed_peer = {
                let q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                q.failed.contains(&job.owner) || (pack && q.no_packs.contains(&job.owner))
            };
            let wait = match self.peers.wait_for(job.owner) {
                w if pack => w.min(PACK_WAIT),
                w => w,
            };
            let outcome = match &self.peers.peers[job.owner] {
                _ if self.failure().is_some() => Ok(()),
                // Blocks queued for a peer that failed meanwhile are not asked of it (nor packs
                // of one that did not deliver a pack in time).
                Some(_) if failed_peer && pack => {
                    Err((FetchError::Late(String::new()), job.blocks.clone()))
                }
                Some(_) if failed_peer => {
                    Err((FetchError::Peer(String::new()), job.blocks.clone()))
                }
                Some((addr, client)) => self
                    .fetch(client, wait, &job.key, &job.blocks, job.sink.as_ref())
                    .map_err(|(e, undelivered)| match e {
                        FetchError::Peer(msg) => (
                            FetchError::Peer(format!("fan-out peer {addr}: {msg}")),
                            undelivered,
                        ),
                        FetchError::Late(msg) => (
                            FetchError::Late(format!("fan-out peer {addr}: {msg}")),
                            undelivered,
                        ),
                        local => (local, undelivered),
                    }),
                None => Ok(()),
            };
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            match outcome {
                Ok(()) => {}
                // A pack late: that peer may not be making this session's packs.
                Err((FetchError::Late(msg), undelivered)) if self.refetch && pack => {
                    if q.no_packs.insert(job.owner) {
                        tracing::warn!(
                            "{msg}; the packs of small files it owns now come from the source \
                             (its blocks still from it), and those it did not deliver are asked \
                             of the sender at the end"
                        );
                    }
                    q.orphans.push(Orphans {
                        sink: job.sink.clone(),
                        blocks: undelivered,
                    });
                }
                Err((FetchError::Peer(msg) | FetchError::Late(msg), undelivered))
                    if self.refetch =>
                {
                    q.no_packs.insert(job.owner);
                    if q.failed.insert(job.owner) {
                        tracing::warn!(
                            "{msg}; the blocks it owns now come from the source, and those it \
                             did not deliver are asked of the sender at the end"
                        );
                    }
                    if !undelivered.is_empty() {
                        q.orphans.push(Orphans {
                            sink: job.sink.clone(),
                            blocks: undelivered,
                        });
                    }
                }
                Err((
                    FetchError::Peer(msg) | FetchError::Late(msg) | FetchError::Local(msg),
                    _,
                )) => {
                    tracing::warn!("fan-out: {msg}");
                    let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
                    f.get_or_insert(msg);
                }
            }
            q.done_with(&job);
            let next = q.next_owner().and_then(|o| q.take_for(o));
            match next {
                Some(j) => job = j,
                None => {
                    q.running -= 1;
                    self.idle.notify_all();
                    return;
                }
            }
        }
    }

    /// Takes `blocks` from the owner's service, waiting up to `wait` for those it does not hold
    /// yet. On failure, also the blocks that did not arrive.
    fn fetch(
        &self,
        client: &NodeStoreClient,
        wait: Duration,
        key: &PopKey,
        blocks: &[AnnouncedBlock],
        sink: &dyn FetchSink,
    ) -> Result<(), (FetchError, Vec<AnnouncedBlock>)> {
        let mut delivered = vec![false; blocks.len()];
        let r = self.take_all(client, wait, key, blocks, sink, &mut delivered);
        let undelivered = || {
            blocks
                .iter()
                .zip(&delivered)
                .filter(|(_, d)| !**d)
                .map(|(b, _)| *b)
                .collect::<Vec<_>>()
        };
        match r {
            Err(e) => Err((e, undelivered())),
            Ok(()) => {
                let missing = undelivered();
                if missing.is_empty() {
                    return Ok(());
                }
                let msg = format!(
                    "{} of {} blocks did not arrive within {} s",
                    missing.len(),
                    blocks.len(),
                    wait.as_secs()
                );
                Err((FetchError::Late(msg), missing))
            }
        }
    }

    /// One Take per [`super::MAX_TAKE`] blocks, each within its [`take_budget`]; marks each
    /// block delivered once written.
    fn take_all(
        &self,
        client: &NodeStoreClient,
        wait: Duration,
        key: &PopKey,
        blocks: &[AnnouncedBlock],
        sink: &dyn FetchSink,
        delivered: &mut [bool],
    ) -> Result<(), FetchError> {
        for (part_no, part) in blocks.chunks(super::MAX_TAKE).enumerate() {
            let base = part_no * super::MAX_TAKE;
            let request = super::client::take_request(key, part, wait);
            // Each reply is awaited on the client's runtime and handled here, on this blocking
            // thread (the sink writes files and may wait on the put queue).
            let rt = client.runtime();
            let (patience, budget) = take_budget(wait, part.len());
            let deadline = tokio::time::Instant::now() + patience;
            let mut bytes_left = budget;
            let status =
                |s: tonic::Status| FetchError::Peer(format!("{:?}: {}", s.code(), s.message()));
            let late = || {
                FetchError::Peer(format!(
                    "a Take of {} blocks did not end within {} s",
                    part.len(),
                    patience.as_secs()
                ))
            };
            let mut c = client.grpc();
            let mut stream = super::client::TakenBlocks::new(
                rt.block_on(tokio::time::timeout_at(deadline, c.take(request)))
                    .map_err(|_| late())?
                    .map_err(status)?
                    .into_inner(),
            );
            loop {
                let next = rt
                    .block_on(tokio::time::timeout_at(deadline, stream.next()))
                    .map_err(|_| late())?
                    .map_err(status)?;
                let Some(b) = next else { break };
                let (pos, a) = super::client::checked_block(part, &b)
                    .map_err(|e| FetchError::Peer(e.to_owned()))?;
                let len = b.data.len() as u64;
                bytes_left = bytes_left.checked_sub(len).ok_or_else(|| {
                    FetchError::Peer(format!(
                        "it sent more than the {budget} bytes a Take of {} blocks may bring \
                         (each block once, and one repeat)",
                        part.len()
                    ))
                })?;
                if !delivered[base + pos] {
                    sink.deliver(a, b.data).map_err(FetchError::Local)?;
                    delivered[base + pos] = true;
                    self.blocks.fetch_add(1, Ordering::Relaxed);
                    self.bytes.fetch_add(len, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    /// Waits until every block admitted was fetched or failed (from a blocking thread). Returns
    /// the blocks failed peers did not deliver (only with refetch), or the first failure.
    pub fn wait_idle(&self) -> Result<Vec<Orphans>, String> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        while q.running > 0 || !q.is_empty() {
            q = self.idle.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        let orphans = std::mem::take(&mut q.orphans);
        drop(q);
        self.failure().map_or(Ok(orphans), Err)
    }
}

impl std::fmt::Debug for Fetches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fetches({} destinations)", self.peers.destinations())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ownership as seen by destination `me` of `n`, every peer reachable except its own.
    fn owners(n: usize, me: usize, path: &[u8], blocks: u64) -> Vec<Option<usize>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let swarm = SwarmPeers {
            peers: (0..n).map(|_| None).collect(),
            me,
            wait: Duration::from_secs(1),
            holders: Vec::new(),
            runtime: rt.handle().clone(),
        };
        (0..blocks)
            .map(|i| Some(swarm.owner_index(path_start(path), i)))
            .collect()
    }

    #[test]
    fn every_destination_owns_an_equal_share_of_a_large_file() {
        for n in [2, 3, 4, 7] {
            for path in [&b"part-00.bin"[..], b"a/b/c", b"x"] {
                let got = owners(n, 0, path, 256);
                let mut share = vec![0u64; n];
                for o in got.iter().flatten() {
                    share[*o] += 1;
                }
                let (lo, hi) = (share.iter().min().unwrap(), share.iter().max().unwrap());
                assert!(hi - lo <= 1, "{n} destinations, {path:?}: shares {share:?}");
                // Consecutive blocks go to different destinations.
                assert!(got.windows(2).all(|w| w[0] != w[1]), "{n}: {got:?}");
            }
        }
    }

    #[test]
    fn blocks_no_receiving_destination_owns_come_from_the_holders_of_the_whole_tree() {
        // Destination 1 of 4; 0 receives, 2 finished (holds the whole tree), 3 does not receive.
        let holders = [2];
        // A receiving owner is asked, holder or not.
        assert_eq!(take_from(0, 1, true, &holders, 7), Some(0));
        assert_eq!(take_from(2, 1, true, &holders, 7), Some(2));
        // Its own blocks and those of one that does not receive: from the holder.
        assert_eq!(take_from(1, 1, true, &holders, 7), Some(2));
        assert_eq!(take_from(3, 1, false, &holders, 7), Some(2));
        // Without holders, the sender sends them.
        assert_eq!(take_from(1, 1, true, &[], 7), None);
        assert_eq!(take_from(3, 1, false, &[], 7), None);
        // Several holders share the load block by block.
        let picked: Vec<_> = (0..6)
            .map(|i| take_from(1, 1, true, &[0, 2, 3], i).unwrap())
            .collect();
        assert_eq!(picked, [0, 2, 3, 0, 2, 3]);
    }

    #[test]
    fn a_take_may_bring_each_block_once_and_one_repeat_within_its_wait_and_a_margin() {
        const MIB: u64 = 1 << 20;
        let (time, bytes) = take_budget(Duration::from_secs(120), 16);
        assert_eq!(time, Duration::from_secs(120 + 10 + 16 * 5));
        assert_eq!(bytes, 17 * 4 * MIB);
        let (time, bytes) = take_budget(Duration::from_secs(1), 1);
        assert_eq!((time, bytes), (Duration::from_secs(16), 8 * MIB));
    }

    #[test]
    fn the_fetch_threads_are_shared_among_the_peers() {
        assert_eq!(fetches_per_peer(2), MAX_FETCHES_PER_PEER);
        assert_eq!(fetches_per_peer(4), 10);
        assert_eq!(fetches_per_peer(5), 8);
        assert_eq!(fetches_per_peer(9), 4);
        assert_eq!(fetches_per_peer(500), MIN_FETCHES_PER_PEER);
        for n in 2..=9 {
            assert!(fetches_per_peer(n) * (n - 1) <= MAX_FETCHES, "{n}");
        }
    }

    #[test]
    fn every_destination_computes_the_same_owners() {
        let first = owners(5, 0, b"shard-7.tar", 64);
        for me in 1..5 {
            assert_eq!(owners(5, me, b"shard-7.tar", 64), first);
        }
        // Another file starts elsewhere, so files of one block each spread too.
        let starts: std::collections::BTreeSet<_> = (0..64)
            .map(|i| owners(5, 0, format!("f{i}").as_bytes(), 1)[0])
            .collect();
        assert!(starts.len() > 1, "{starts:?}");
    }

    #[test]
    fn with_no_peer_reachable_every_block_comes_from_the_source() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let swarm = SwarmPeers {
            peers: (0..3).map(|_| None).collect(),
            me: 1,
            wait: Duration::from_secs(1),
            holders: Vec::new(),
            runtime: rt.handle().clone(),
        };
        // No peer is reachable here, so every block comes from the source.
        assert!((0..30).all(|i| swarm.owner(b"f", i).is_none()));
    }
}
