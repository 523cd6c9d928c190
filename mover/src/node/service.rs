//! The `BlockStore` gRPC service over one node's store. Every client is treated as hostile (a
//! tenant can read its receiver's certificate from its own namespace): requests are bounded, a
//! block is handed out only against a proof of possession checked against the secret stored
//! beside it, an absent block and a refused proof get the same answer after the same work, and
//! a block put into the store is hashed here again before it is kept.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_proto::blockstore::v1 as pb;
use ferry_proto::blockstore::v1::block_store_server::BlockStore;
use futures::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::MAX_TAKE;
use super::counters::ServiceCounters;
use super::gate::client_of;
use super::outgoing::{BLOCK_DEADLINE, Next, Outgoing};
use super::shares::{ClientShare, Shares, TURN_WAIT, busy};
use super::stores::Stores;
use super::waiters::Waiters;
use crate::cas::dedup::{AnnouncedBlock, DedupReceiver};
use crate::cas::pop::{PopKey, Proof};
use crate::cas::store::BlockSink;
use crate::cas::{BLOCK_SIZE, BlockHash, CasError, InsertOutcome};
use crate::net::{PeerIdentity, Role, Tenancy};

pub struct BlockStoreService {
    /// The node's store and the stores of namespaces and runs ([`Stores`]).
    pub stores: Arc<Stores>,
    pub counters: Arc<ServiceCounters>,
    pub scans: Arc<super::metrics::ScanCache>,
    pub node: String,
    /// The service's bounds and each client's share of them.
    pub shares: Arc<Shares>,
    /// Fan-out Takes waiting for blocks, woken by the Put of their hash.
    pub waiters: Arc<Waiters>,
}

/// The longest a fan-out Take may wait for blocks to arrive.
pub const MAX_TAKE_WAIT: Duration = Duration::from_secs(120);

/// The most a Take's reply carries per message when the client takes blocks in pieces: what
/// a stream keeps in buffers between blocks (gRPC keeps each stream's encoding buffer, as
/// large as its largest message, until the stream ends).
pub const TAKE_PIECE: usize = 128 * 1024;

type TakeStream = Pin<Box<dyn Stream<Item = Result<pb::TakenBlock, Status>> + Send>>;

/// Blocks handed to the response stream as they are read; a client that went away, or does
/// not take its blocks in time, stops the reading at its next block.
struct StreamSink {
    tx: tokio::sync::mpsc::Sender<Result<Outgoing, Status>>,
    share: Arc<ClientShare>,
    piece: usize,
    expired: Arc<AtomicU64>,
    /// Cancelled when a block of this Take was not taken in time.
    cancelled: CancellationToken,
    runtime: tokio::runtime::Handle,
}

impl BlockSink for StreamSink {
    fn write_block(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        let broken = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let position = u32::try_from(offset / BLOCK_SIZE as u64).unwrap_or(u32::MAX);
        // Called on a blocking thread: waiting here holds this read, never a runtime thread.
        // Every wait ends when the Take is cancelled (a block of it was not taken in time).
        let place = self
            .runtime
            .block_on(
                self.cancelled
                    .run_until_cancelled(self.share.places.acquire(TURN_WAIT)),
            )
            .ok_or_else(broken)?
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::TimedOut))?;
        let block = Outgoing::new(
            position,
            data,
            self.piece,
            place,
            &self.runtime,
            self.expired.clone(),
            self.cancelled.clone(),
        );
        // The block ahead of this one leaves the queue within its own deadline, or the Take is
        // cancelled: either way this wait ends.
        self.runtime
            .block_on(
                self.cancelled.run_until_cancelled(
                    self.tx
                        .send_timeout(Ok(block), BLOCK_DEADLINE + Duration::from_secs(1)),
                ),
            )
            .ok_or_else(broken)?
            .map_err(|_| broken())
    }

    fn parallel_reads(&self) -> bool {
        false
    }
}

fn fixed32(bytes: &[u8], what: &str) -> Result<[u8; 32], Status> {
    bytes
        .try_into()
        .map_err(|_| Status::invalid_argument(format!("{what} must be 32 bytes")))
}

/// A `Take` as the store reads it: the proof key and the announced blocks, each block's index
/// standing for its position in the request. Refused whole when anything is malformed or there
/// are more than [`MAX_TAKE`] blocks.
pub fn parse_take(
    req: &pb::TakeRequest,
) -> Result<(PopKey, Vec<AnnouncedBlock>, Duration), Status> {
    if req.blocks.len() > MAX_TAKE {
        return Err(Status::invalid_argument(format!(
            "at most {MAX_TAKE} blocks per request"
        )));
    }
    let wait = Duration::from_millis(req.wait_ms.into());
    if wait > MAX_TAKE_WAIT {
        return Err(Status::invalid_argument(format!(
            "wait_ms must be at most {}",
            MAX_TAKE_WAIT.as_millis()
        )));
    }
    let key = PopKey::from_bytes(fixed32(&req.pop_key, "pop_key")?);
    let announced = req
        .blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            Ok(AnnouncedBlock {
                // The position stands in for the block index: the sink maps it back.
                index: i as u64,
                hash: BlockHash::from(fixed32(&b.hash, "hash")?),
                proof: Proof(fixed32(&b.proof, "proof")?),
            })
        })
        .collect::<Result<Vec<_>, Status>>()?;
    Ok((key, announced, wait))
}

/// A `Put`'s hash, when the request is well formed (a full block, or a file's last block of at
/// least 1 MiB; the content is checked against the hash when it is kept).
pub fn parse_put(req: &pb::PutRequest) -> Result<BlockHash, Status> {
    let hash = BlockHash::from(fixed32(&req.hash, "hash")?);
    if !crate::cas::storable(req.data.len()) {
        return Err(Status::invalid_argument(
            "only blocks of 1 MiB to 4 MiB are kept (full blocks and long tails)",
        ));
    }
    Ok(hash)
}

/// One `Take`: reads the proven blocks it asked for, once or (fan-out) each time blocks arrive.
struct Take {
    stores: Arc<Stores>,
    tenancy: Option<Tenancy>,
    counters: Arc<ServiceCounters>,
    share: Arc<ClientShare>,
    client: String,
    key: PopKey,
    piece: usize,
    cancelled: CancellationToken,
}

impl Take {
    /// Sends every block of `announced` the store holds (with its proof matching) down `tx` and
    /// returns the others.
    async fn read(
        &self,
        announced: Vec<AnnouncedBlock>,
        tx: tokio::sync::mpsc::Sender<Result<Outgoing, Status>>,
    ) -> Result<Vec<AnnouncedBlock>, Status> {
        let turn = self
            .share
            .readers
            .acquire(TURN_WAIT)
            .await
            .ok_or_else(|| busy("every store reader is taken"))?;
        let (stores, tenancy, counters, client, key) = (
            self.stores.clone(),
            self.tenancy.clone(),
            self.counters.clone(),
            self.client.clone(),
            self.key.clone(),
        );
        let sink = StreamSink {
            tx,
            share: self.share.clone(),
            piece: self.piece,
            expired: self.counters.sends_expired.clone(),
            cancelled: self.cancelled.clone(),
            runtime: tokio::runtime::Handle::current(),
        };
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let store = stores.of(tenancy.as_ref())?;
            // A lease per read pins the proven blocks while they are read.
            let d = DedupReceiver::new(store, &client).map_err(read_failed)?;
            let need = d
                .materialize_announced(&key, &sink, &announced)
                .map_err(read_failed)?;
            let c = d.counters();
            counters.hits.fetch_add(c.dedup_blocks, Ordering::Relaxed);
            counters
                .hit_bytes
                .fetch_add(c.dedup_bytes, Ordering::Relaxed);
            Ok::<_, Status>(
                announced
                    .into_iter()
                    .zip(need)
                    .filter_map(|(a, n)| n.then_some(a))
                    .collect(),
            )
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .inspect_err(|e| {
            tracing::warn!(client = %self.client, error = %e.message(), "block store read failed");
        })
    }
}

/// The reply stream of a Take: each block's pieces in turn; a block's place is given back when
/// the stream is asked for the message after its last piece (by then HTTP/2 has that piece).
fn reply_stream(
    rx: tokio::sync::mpsc::Receiver<Result<Outgoing, Status>>,
    in_use: Option<crate::net::InUse>,
) -> TakeStream {
    let state = (rx, None::<Outgoing>, in_use);
    Box::pin(futures::stream::unfold(
        state,
        |(mut rx, mut sending, in_use)| async move {
            loop {
                if let Some(o) = sending.as_mut() {
                    match o.next_message() {
                        Next::Piece(message) => return Some((Ok(message), (rx, sending, in_use))),
                        Next::Sent => drop(sending.take()),
                        Next::Expired => {
                            rx.close();
                            let status = Status::deadline_exceeded(
                                "a block was not taken in time; the stream is dropped",
                            );
                            return Some((Err(status), (rx, None, in_use)));
                        }
                    }
                }
                match rx.recv().await? {
                    Ok(o) => sending = Some(o),
                    Err(status) => return Some((Err(status), (rx, None, in_use))),
                }
            }
        },
    ))
}

fn read_failed(e: CasError) -> Status {
    Status::unavailable(format!("block store read failed: {e}"))
}

/// What the client's certificate states of its tenancy.
fn tenancy_of<T>(req: &Request<T>) -> Option<Tenancy> {
    req.extensions()
        .get::<PeerIdentity>()
        .and_then(|p| p.tenancy.clone())
}

/// Whether a request comes from the operator (the only client served the store's figures).
fn from_operator<T>(req: &Request<T>) -> bool {
    req.extensions()
        .get::<PeerIdentity>()
        .and_then(|p| p.identity.as_ref())
        .is_some_and(|i| i.role == Role::Operator)
}

fn receivers_only<T>(req: &Request<T>) -> Result<(), Status> {
    if from_operator(req) {
        return Err(Status::permission_denied(
            "the operator reads the store's figures; it neither takes nor puts blocks",
        ));
    }
    Ok(())
}

#[tonic::async_trait]
impl BlockStore for BlockStoreService {
    type TakeStream = TakeStream;

    async fn take(
        &self,
        req: Request<pb::TakeRequest>,
    ) -> Result<Response<Self::TakeStream>, Status> {
        receivers_only(&req)?;
        let client = client_of(req.extensions());
        let in_use = req
            .extensions()
            .get::<PeerIdentity>()
            .map(|p| p.activity.begin());
        let (key, announced, wait) = parse_take(req.get_ref())?;
        let piece = if req.get_ref().pieces {
            TAKE_PIECE
        } else {
            usize::MAX
        };
        let tenancy = tenancy_of(&req);
        let share = self.shares.of(&client);
        // Only the siblings of one fan-out run wait for each other's blocks, within a share of
        // the waiting slots per run.
        let waiting = match (wait.is_zero(), &tenancy) {
            (true, _) => None,
            (false, None) => {
                return Err(Status::permission_denied(
                    "a Take that waits is for the destinations of one fan-out run, and the \
                     client's certificate names no run",
                ));
            }
            (false, Some(t)) => Some(
                self.shares
                    .of(&format!("run {}", t.run))
                    .waiting
                    .try_acquire()
                    .ok_or_else(|| {
                        Status::resource_exhausted("too many fan-out requests are waiting")
                    })?,
            ),
        };
        let run = tenancy.as_ref().map(|t| t.run.clone()).unwrap_or_default();
        // One block queued per request; the bounds are the client's and the service's places.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let take = Take {
            stores: self.stores.clone(),
            tenancy,
            counters: self.counters.clone(),
            share,
            client,
            key,
            piece,
            cancelled: CancellationToken::new(),
        };
        let waiters = self.waiters.clone();
        tokio::spawn(async move {
            let _waiting = waiting;
            let deadline = tokio::time::Instant::now() + wait;
            let wake = Arc::new(tokio::sync::Notify::new());
            // Registered before the store is read, so a Put during the read is not missed.
            let _registration = waiting_for(&waiters, &run, &announced, wait, &wake);
            let mut left = announced;
            loop {
                match take.read(left, tx.clone()).await {
                    Ok(rest) => left = rest,
                    Err(status) => {
                        left = Vec::new();
                        let _ = tx.try_send(Err(status));
                    }
                }
                if left.is_empty() || wait.is_zero() || take.cancelled.is_cancelled() {
                    break;
                }
                tokio::select! {
                    () = wake.notified() => {}
                    () = tx.closed() => break,
                    () = take.cancelled.cancelled() => break,
                    () = tokio::time::sleep_until(deadline) => break,
                }
            }
            take.counters
                .misses
                .fetch_add(left.len() as u64, Ordering::Relaxed);
        });
        Ok(Response::new(reply_stream(rx, in_use)))
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutReply>, Status> {
        receivers_only(&req)?;
        let tenancy = tenancy_of(&req);
        // A receiver keeps blocks at its own node's service; a sibling of another node only
        // takes them here (a tenant's certificate does not fill every node's store).
        if let Some(t) = tenancy.as_ref().filter(|t| !t.is_local_to(&self.node)) {
            return Err(Status::permission_denied(format!(
                "this service keeps blocks for receivers on node {}; a receiver on node {} \
                 may only take blocks here",
                self.node,
                t.node.as_deref().unwrap_or_default()
            )));
        }
        let req = req.into_inner();
        let hash = parse_put(&req)?;
        let (stores, counters) = (self.stores.clone(), self.counters.clone());
        let run = tenancy.as_ref().map(|t| t.run.clone()).unwrap_or_default();
        // The store hashes the data before keeping it and refuses a mismatch.
        let outcome = match tokio::task::spawn_blocking(move || {
            stores
                .of(tenancy.as_ref())
                .map(|store| store.insert(&hash, &req.data))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??
        {
            Ok(o) => o,
            Err(CasError::HashMismatch { .. }) => {
                self.counters.put_refused.fetch_add(1, Ordering::Relaxed);
                return Err(Status::invalid_argument(
                    "the block's content does not match its hash",
                ));
            }
            Err(e) => {
                return Err(Status::unavailable(format!(
                    "block store write failed: {e}"
                )));
            }
        };
        if outcome == InsertOutcome::Inserted {
            counters.inserted.fetch_add(1, Ordering::Relaxed);
            self.waiters.wake(&run, &hash);
        }
        // "Stored", whether or not it was new: a client must not learn from the reply that
        // another tenant holds the same content.
        Ok(Response::new(pb::PutReply { inserted: true }))
    }

    async fn stats(
        &self,
        req: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StoreStats>, Status> {
        // Per-block figures tell who stores and takes what: the operator's alone.
        if !from_operator(&req) {
            return Err(Status::permission_denied(
                "the store's figures are served to the operator only",
            ));
        }
        let (store, scans) = (self.stores.root().clone(), self.scans.clone());
        let stats = tokio::task::spawn_blocking(move || scans.get(&store))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::unavailable(format!("block store scan failed: {e}")))?;
        Ok(Response::new(super::metrics::figures(
            &self.node,
            &stats,
            &self.counters,
        )))
    }
}

/// The registration of a fan-out Take's blocks with the waiters (none for a Take that does not
/// wait).
fn waiting_for<'a>(
    waiters: &'a Waiters,
    run: &str,
    announced: &[AnnouncedBlock],
    wait: Duration,
    wake: &Arc<tokio::sync::Notify>,
) -> Option<super::waiters::Registration<'a>> {
    let hashes: Vec<BlockHash> = announced.iter().map(|a| a.hash).collect();
    (!wait.is_zero()).then(|| waiters.register(run, &hashes, wake.clone()))
}
