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
use tonic::{Request, Response, Status};

use super::MAX_TAKE;
use crate::cas::dedup::{AnnouncedBlock, DedupReceiver};
use crate::cas::pop::{PopKey, Proof};
use crate::cas::store::BlockSink;
use crate::cas::{BLOCK_SIZE, BlockHash, CasError, CasStore, InsertOutcome};
use crate::net::PeerIdentity;

/// What the service counted since it started (the store's own figures come from a scan).
#[derive(Debug, Default)]
pub struct ServiceCounters {
    pub hits: AtomicU64,
    pub hit_bytes: AtomicU64,
    pub proofs_rejected: AtomicU64,
    pub inserted: AtomicU64,
    pub put_refused: AtomicU64,
    pub last_gc_unix: AtomicU64,
    pub evicted: AtomicU64,
    /// Woken on every insert: fan-out Takes waiting for blocks look again.
    pub inserts: tokio::sync::Notify,
}

pub struct BlockStoreService {
    pub store: Arc<CasStore>,
    pub counters: Arc<ServiceCounters>,
    pub scans: Arc<super::metrics::ScanCache>,
    pub node: String,
    /// Store reads running at once, over all clients (each `Take` reads up to 256 blocks, one
    /// at a time): more clients wait their turn instead of taking every thread.
    pub readers: Arc<tokio::sync::Semaphore>,
    /// Fan-out Takes allowed to wait at once ([`MAX_WAITING_TAKES`]).
    pub waiters: Arc<tokio::sync::Semaphore>,
    /// Blocks read for Takes and not yet sent, over all clients ([`MAX_OUTGOING_BLOCKS`]).
    pub outgoing: Arc<tokio::sync::Semaphore>,
}

/// Default for [`BlockStoreService::readers`].
pub const MAX_CONCURRENT_TAKES: usize = 8;
/// The longest a fan-out Take may wait for blocks to arrive.
pub const MAX_TAKE_WAIT: Duration = Duration::from_secs(120);
/// Fan-out Takes waiting at once (they hold no reader while waiting, only a small task).
pub const MAX_WAITING_TAKES: usize = 256;
/// Blocks (4 MiB each) read for Takes that may be in the service's memory at once, in the
/// streams' queues or being sent: 64 MiB whatever the number of clients. A block holds its
/// place from its copy until the stream asks for the message after its last piece, by when
/// HTTP/2 has it on its way; a stream between blocks keeps at most a [`TAKE_PIECE`]. With
/// [`MAX_CONCURRENT_TAKES`] read buffers this bounds what Takes cost, so the pod's memory limit
/// holds however many destinations take from this node.
pub const MAX_OUTGOING_BLOCKS: usize = 16;

/// The most a Take's reply carries per message when the client takes blocks in pieces: what
/// a stream keeps in buffers between blocks (gRPC keeps each stream's encoding buffer, as
/// large as its largest message, until the stream ends).
pub const TAKE_PIECE: usize = 128 * 1024;

type TakeStream = Pin<Box<dyn Stream<Item = Result<pb::TakenBlock, Status>> + Send>>;

/// Blocks handed to the response stream as they are read; a client that went away stops the
/// reading at its next block.
struct StreamSink {
    tx: tokio::sync::mpsc::Sender<Result<Outgoing, Status>>,
    outgoing: Arc<tokio::sync::Semaphore>,
    runtime: tokio::runtime::Handle,
}

/// A block on its way to a client, holding its place among [`MAX_OUTGOING_BLOCKS`] until
/// its last piece went out.
struct Outgoing {
    position: u32,
    data: bytes::Bytes,
    /// How much of `data` went out.
    sent: usize,
    _place: tokio::sync::OwnedSemaphorePermit,
}

impl Outgoing {
    fn done(&self) -> bool {
        self.sent >= self.data.len()
    }

    /// The next message: at most `piece` bytes of the block, a slice of it (not a copy).
    fn next_piece(&mut self, piece: usize) -> pb::TakenBlock {
        let end = self.data.len().min(self.sent.saturating_add(piece));
        let more = end < self.data.len();
        let data = self.data.slice(self.sent..end);
        self.sent = end;
        pb::TakenBlock {
            position: self.position,
            data,
            more,
        }
    }
}

impl BlockSink for StreamSink {
    fn write_block(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        let broken = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let position = u32::try_from(offset / BLOCK_SIZE as u64).unwrap_or(u32::MAX);
        // Called on a blocking thread: waiting here holds this read, never a runtime thread.
        let place = self
            .runtime
            .block_on(self.outgoing.clone().acquire_owned())
            .map_err(|_| broken())?;
        self.tx
            .blocking_send(Ok(Outgoing {
                position,
                data: bytes::Bytes::copy_from_slice(data),
                sent: 0,
                _place: place,
            }))
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

/// The lease name of a client: its transfer id (the verifier admitted only receivers).
fn client_name<T>(req: &Request<T>) -> String {
    req.extensions()
        .get::<PeerIdentity>()
        .and_then(|p| p.0.as_ref())
        .map_or_else(|| "unknown".to_owned(), |i| i.transfer_id.clone())
}

/// One `Take`: reads the proven blocks it asked for, once or (fan-out) each time blocks arrive.
struct Take {
    store: Arc<CasStore>,
    counters: Arc<ServiceCounters>,
    readers: Arc<tokio::sync::Semaphore>,
    outgoing: Arc<tokio::sync::Semaphore>,
    client: String,
    key: PopKey,
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
            .readers
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Status::unavailable("the node service is stopping"))?;
        let (store, counters, client, key) = (
            self.store.clone(),
            self.counters.clone(),
            self.client.clone(),
            self.key.clone(),
        );
        let outgoing = self.outgoing.clone();
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let sink = StreamSink {
                tx,
                outgoing,
                runtime,
            };
            // A lease per read pins the proven blocks while they are read.
            let d = DedupReceiver::new(store, &client)?;
            let need = d.materialize_announced(&key, &sink, &announced)?;
            let c = d.counters();
            counters.hits.fetch_add(c.dedup_blocks, Ordering::Relaxed);
            counters
                .hit_bytes
                .fetch_add(c.dedup_bytes, Ordering::Relaxed);
            counters
                .proofs_rejected
                .fetch_add(c.proofs_rejected, Ordering::Relaxed);
            Ok::<_, CasError>(
                announced
                    .into_iter()
                    .zip(need)
                    .filter_map(|(a, n)| n.then_some(a))
                    .collect(),
            )
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| {
            tracing::warn!(client = %self.client, error = %e, "block store read failed");
            Status::unavailable(format!("block store read failed: {e}"))
        })
    }
}

#[tonic::async_trait]
impl BlockStore for BlockStoreService {
    type TakeStream = TakeStream;

    async fn take(
        &self,
        req: Request<pb::TakeRequest>,
    ) -> Result<Response<Self::TakeStream>, Status> {
        let client = client_name(&req);
        let (key, announced, wait) = parse_take(req.get_ref())?;
        let piece = if req.get_ref().pieces {
            TAKE_PIECE
        } else {
            usize::MAX
        };
        // One block queued per client; the service-wide bound is MAX_OUTGOING_BLOCKS.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let waiting =
            if wait.is_zero() {
                None
            } else {
                Some(self.waiters.clone().try_acquire_owned().map_err(|_| {
                    Status::resource_exhausted("too many fan-out requests are waiting")
                })?)
            };
        let take = Take {
            store: self.store.clone(),
            counters: self.counters.clone(),
            readers: self.readers.clone(),
            outgoing: self.outgoing.clone(),
            client,
            key,
        };
        tokio::spawn(async move {
            let _waiting = waiting;
            let deadline = tokio::time::Instant::now() + wait;
            let mut left = announced;
            loop {
                // Registered before the store is read, so an insert during the read is not missed.
                let inserted = take.counters.inserts.notified();
                tokio::pin!(inserted);
                inserted.as_mut().enable();
                match take.read(left, tx.clone()).await {
                    Ok(rest) => left = rest,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                }
                if left.is_empty() || tx.is_closed() {
                    return;
                }
                if tokio::time::timeout_at(deadline, inserted).await.is_err() {
                    return;
                }
            }
        });
        // A block's place is given back when the stream is asked for the message after its
        // last piece: by then HTTP/2 has taken that piece.
        let sending: Option<Outgoing> = None;
        let stream = futures::stream::unfold((rx, sending), move |(mut rx, sending)| async move {
            let mut o = match sending {
                Some(o) if !o.done() => o,
                sent => {
                    drop(sent);
                    match rx.recv().await? {
                        Ok(o) => o,
                        Err(status) => return Some((Err(status), (rx, None))),
                    }
                }
            };
            let message = o.next_piece(piece);
            Some((Ok(message), (rx, Some(o))))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutReply>, Status> {
        let req = req.into_inner();
        let hash = parse_put(&req)?;
        let (store, counters) = (self.store.clone(), self.counters.clone());
        // The store hashes the data before keeping it and refuses a mismatch.
        let outcome = match tokio::task::spawn_blocking(move || store.insert(&hash, &req.data))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
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
        let inserted = outcome == InsertOutcome::Inserted;
        if inserted {
            counters.inserted.fetch_add(1, Ordering::Relaxed);
            counters.inserts.notify_waiters();
        }
        Ok(Response::new(pb::PutReply { inserted }))
    }

    async fn stats(
        &self,
        _req: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StoreStats>, Status> {
        let (store, scans) = (self.store.clone(), self.scans.clone());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn outgoing(data: Vec<u8>) -> Outgoing {
        let data = data.into();
        let places = Arc::new(tokio::sync::Semaphore::new(1));
        Outgoing {
            position: 7,
            data,
            sent: 0,
            _place: places
                .try_acquire_owned()
                .unwrap_or_else(|_| unreachable!()),
        }
    }

    #[test]
    fn a_block_goes_out_in_pieces_in_order_and_whole_when_it_fits() {
        let data: Vec<u8> = (0..10u8).collect();
        let mut o = outgoing(data.clone());
        let mut got = Vec::new();
        while !o.done() {
            let p = o.next_piece(4);
            assert_eq!(p.position, 7);
            assert!(p.data.len() <= 4);
            got.extend_from_slice(&p.data);
            assert_eq!(p.more, !o.done());
        }
        assert_eq!(got, data);

        let mut o = outgoing(data.clone());
        let whole = o.next_piece(usize::MAX);
        assert_eq!((&whole.data[..], whole.more), (&data[..], false));
        assert!(o.done());
    }
}
