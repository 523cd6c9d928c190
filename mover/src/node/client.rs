//! A receiver's side of its node's block store service. The receiver's session calls it from
//! its blocking threads, as it would a local store: each call waits on the runtime the client
//! was connected on. The store is a cache: a failing service costs dedup, never the transfer.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_proto::blockstore::v1 as pb;
use ferry_proto::blockstore::v1::block_store_client::BlockStoreClient;
use tonic::transport::Channel;

use super::{MAX_MESSAGE, MAX_TAKE};
use crate::cas::dedup::{AnnouncedBlock, DedupCounters};
use crate::cas::pop::PopKey;
use crate::cas::store::BlockSink;
use crate::cas::{BLOCK_SIZE, BlockHash};
use crate::net::TlsFiles;

/// How long one Put may take before the block is left out of the store.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A Take must bring its next block (or its end) within this, and be done within
/// [`TAKE_DEADLINE_BASE`] plus [`TAKE_DEADLINE_PER_BLOCK`] for each block asked: a service that
/// stalls a reply (a hostile client holding its readers, a stuck disk) costs a bounded wait, and
/// the blocks come over the wire.
const TAKE_IDLE: Duration = Duration::from_secs(10);
const TAKE_DEADLINE_BASE: Duration = Duration::from_secs(10);
const TAKE_DEADLINE_PER_BLOCK: Duration = Duration::from_millis(250);
/// Failed calls in a row after which a session stops asking the service (see [`Breaker`]).
const FAILURES_TO_TRIP: u32 = 3;
/// Failures are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum NodeClientError {
    #[error("invalid block store service address {0:?}")]
    Address(String),
    #[error("failed to build the TLS settings for the block store service")]
    Tls(#[source] crate::net::TlsError),
    #[error("failed to connect to the block store service at {addr}")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// A connection to the node service, shared by a receiver's sessions.
#[derive(Clone)]
pub struct NodeStoreClient {
    client: BlockStoreClient<Channel>,
    runtime: tokio::runtime::Handle,
    addr: String,
}

impl std::fmt::Debug for NodeStoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeStoreClient({})", self.addr)
    }
}

impl NodeStoreClient {
    /// Connects (on the current runtime) with the receiver's own certificate; the server must
    /// present this cluster's node service identity.
    pub async fn connect(addr: &str, files: &TlsFiles) -> Result<Self, NodeClientError> {
        let resolved = tokio::net::lookup_host(addr)
            .await
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| NodeClientError::Address(addr.to_owned()))?;
        let tls = Arc::new(
            crate::net::node_client_config(&files.local_only()).map_err(NodeClientError::Tls)?,
        );
        let channel = crate::net::tls_channel(resolved, tls, |e| {
            e.initial_stream_window_size(Some(2 << 20))
                .initial_connection_window_size(Some(8 << 20))
                .connect_timeout(Duration::from_secs(5))
        })
        .await
        .map_err(|source| NodeClientError::Connect {
            addr: addr.to_owned(),
            source,
        })?;
        let client = BlockStoreClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        Ok(Self {
            client,
            runtime: tokio::runtime::Handle::current(),
            addr: addr.to_owned(),
        })
    }

    /// The runtime the connection was made on (calls from blocking threads wait on it).
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// The gRPC client (cheap to clone).
    pub fn grpc(&self) -> BlockStoreClient<Channel> {
        self.client.clone()
    }

    /// The service's figures.
    pub async fn stats(&self) -> Result<pb::StoreStats, tonic::Status> {
        let mut c = self.client.clone();
        Ok(c.stats(pb::StatsRequest {}).await?.into_inner())
    }
}

/// A `Take` of `blocks` (at most [`MAX_TAKE`]) proven under `key`, waiting up to `wait` for
/// those not there yet.
pub(super) fn take_request(
    key: &PopKey,
    blocks: &[AnnouncedBlock],
    wait: Duration,
) -> pb::TakeRequest {
    pb::TakeRequest {
        pop_key: key.to_bytes().to_vec(),
        blocks: blocks
            .iter()
            .map(|a| pb::AnnouncedBlock {
                hash: a.hash.as_bytes().to_vec(),
                proof: a.proof.0.to_vec(),
            })
            .collect(),
        wait_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX),
        pieces: true,
    }
}

/// A Take's reply as whole blocks, put together from their pieces.
pub(super) struct TakenBlocks {
    stream: tonic::Streaming<pb::TakenBlock>,
    pieces: Pieces,
}

impl TakenBlocks {
    pub(super) fn new(stream: tonic::Streaming<pb::TakenBlock>) -> Self {
        Self {
            stream,
            pieces: Pieces::default(),
        }
    }

    /// The next whole block (not yet checked against its hash); a malformed reply is the
    /// service's error (see [`Pieces`]).
    pub(super) async fn next(&mut self) -> Result<Option<pb::TakenBlock>, tonic::Status> {
        loop {
            let Some(message) = self.stream.message().await? else {
                self.pieces.finish().map_err(tonic::Status::data_loss)?;
                return Ok(None);
            };
            if let Some(block) = self
                .pieces
                .push(message)
                .map_err(tonic::Status::data_loss)?
            {
                return Ok(Some(block));
            }
        }
    }
}

/// Puts each block of a reply together from its pieces. A piece of another block before the
/// last one ended, a reply that ends inside a block, or a block longer than [`BLOCK_SIZE`] is
/// refused.
#[derive(Default)]
pub(super) struct Pieces(Option<(u32, bytes::BytesMut)>);

impl Pieces {
    /// Adds a message; returns the block once its last piece came.
    pub(super) fn push(
        &mut self,
        piece: pb::TakenBlock,
    ) -> Result<Option<pb::TakenBlock>, &'static str> {
        let so_far = self.0.as_ref().map_or(0, |(_, block)| block.len());
        if so_far + piece.data.len() > BLOCK_SIZE {
            return Err("a returned block is too long");
        }
        let (position, mut block) = match self.0.take() {
            // A whole block passes as it came.
            None if !piece.more => return Ok(Some(piece)),
            None => (piece.position, bytes::BytesMut::with_capacity(BLOCK_SIZE)),
            Some((position, block)) => {
                if piece.position != position {
                    return Err("the pieces of two blocks interleave");
                }
                (position, block)
            }
        };
        block.extend_from_slice(&piece.data);
        if piece.more {
            self.0 = Some((position, block));
            return Ok(None);
        }
        Ok(Some(pb::TakenBlock {
            position,
            data: block.freeze(),
            more: false,
        }))
    }

    /// The reply ended: right only between blocks.
    pub(super) fn finish(&self) -> Result<(), &'static str> {
        match self.0 {
            Some(_) => Err("a reply ended inside a block"),
            None => Ok(()),
        }
    }
}

/// A block a service returned for the request `part`: its position and what was announced for
/// it, once its bytes are checked against that hash (the service is not trusted to have sent the
/// block asked for).
pub(super) fn checked_block<'a>(
    part: &'a [AnnouncedBlock],
    b: &pb::TakenBlock,
) -> Result<(usize, &'a AnnouncedBlock), &'static str> {
    let pos = b.position as usize;
    let a = part.get(pos).ok_or("a block position out of range")?;
    if b.data.len() > BLOCK_SIZE || BlockHash::of(&b.data) != a.hash {
        return Err("a returned block does not match its hash");
    }
    Ok((pos, a))
}

/// Blocks waiting to be put: a receiver thread hands a block over and goes on while it travels
/// to the service; a full queue makes it wait (every verified block reaches the store).
const PUT_QUEUE: usize = 4;
/// Puts in flight at once.
const PUT_WORKERS: usize = 2;
/// How long a finished session waits for its queued puts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

type PutQueue = tokio::sync::mpsc::Sender<(BlockHash, Bytes)>;

/// One session's use of the node service: what [`crate::cas::dedup::DedupReceiver`] does with
/// a local store, over the wire.
pub struct NodeDedup {
    client: NodeStoreClient,
    counters: Arc<Counters>,
    puts: Mutex<Option<PutQueue>>,
    workers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

#[derive(Default)]
struct Counters {
    dedup_blocks: AtomicU64,
    dedup_bytes: AtomicU64,
    blocks_inserted: AtomicU64,
    failures: AtomicU64,
    last_log: Mutex<Option<Instant>>,
    breaker: Breaker,
}

/// A session's circuit breaker on its node service: a service that misbehaves (a Take that
/// stalls, or [`FAILURES_TO_TRIP`] failed calls in a row) costs the rest of the session its
/// dedup, never the Transfer: from then on every block comes over the wire and none is put.
#[derive(Default)]
struct Breaker {
    in_a_row: std::sync::atomic::AtomicU32,
    open: std::sync::atomic::AtomicBool,
}

impl Breaker {
    fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    fn succeeded(&self) {
        self.in_a_row.store(0, Ordering::Relaxed);
    }

    /// Records a failure; `stalled` trips at once. Returns whether this one tripped it.
    fn failed(&self, stalled: bool) -> bool {
        let n = self.in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        (stalled || n >= FAILURES_TO_TRIP) && !self.open.swap(true, Ordering::Relaxed)
    }
}

impl Counters {
    /// Counts a failed call and logs it (at most every [`LOG_EVERY`]); `cost` says what it cost.
    fn failed(&self, addr: &str, what: &str, cost: &str, status: &tonic::Status) {
        let stalled = status.code() == tonic::Code::DeadlineExceeded;
        if self.breaker.failed(stalled) {
            tracing::warn!(
                service = %addr, code = ?status.code(), message = status.message(),
                "block store service misbehaves ({what} failed); this session takes every \
                 block over the wire from now on"
            );
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_log.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            tracing::warn!(
                service = %addr, code = ?status.code(), message = status.message(),
                failures = self.failures.load(Ordering::Relaxed),
                "block store service: {what} failed ({cost})"
            );
            *last = Some(Instant::now());
        }
    }
}

impl NodeDedup {
    pub fn new(client: NodeStoreClient) -> Self {
        let counters = Arc::new(Counters::default());
        let (tx, rx) = tokio::sync::mpsc::channel::<(BlockHash, Bytes)>(PUT_QUEUE);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let workers = (0..PUT_WORKERS)
            .map(|_| {
                let (rx, counters, client) = (rx.clone(), counters.clone(), client.clone());
                client.runtime.clone().spawn(async move {
                    loop {
                        let next = rx.lock().await.recv().await;
                        let Some((hash, data)) = next else { break };
                        put(&client, &counters, hash, data).await;
                    }
                })
            })
            .collect();
        Self {
            client,
            counters,
            puts: Mutex::new(Some(tx)),
            workers: Mutex::new(workers),
        }
    }

    /// Waits (at most [`DRAIN_TIMEOUT`]) until the blocks queued so far are in the store; later
    /// inserts are dropped. Call from a blocking thread when the session is done.
    pub fn finish(&self) {
        drop(self.puts.lock().unwrap_or_else(|e| e.into_inner()).take());
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        let drained = self.client.runtime.block_on(tokio::time::timeout(
            DRAIN_TIMEOUT,
            futures::future::join_all(workers),
        ));
        if drained.is_err() {
            tracing::warn!("block store service: queued blocks not stored within 30 s; dropped");
        }
    }

    /// Asks the service for the announced blocks (proofs checked there), writes each one it
    /// returns into `dst` after hashing it here too, and answers, parallel to `announced`,
    /// whether each must still come over the wire.
    pub fn materialize_announced(
        &self,
        key: &PopKey,
        dst: &(impl BlockSink + Sync + ?Sized),
        announced: &[AnnouncedBlock],
    ) -> crate::cas::Result<Vec<bool>> {
        let mut need = vec![true; announced.len()];
        for (part_no, part) in announced.chunks(MAX_TAKE).enumerate() {
            if self.counters.breaker.is_open() {
                break;
            }
            let base = part_no * MAX_TAKE;
            let request = take_request(key, part, Duration::ZERO);
            let mut client = self.client.client.clone();
            let deadline = TAKE_DEADLINE_BASE + TAKE_DEADLINE_PER_BLOCK * part.len() as u32;
            let stalled = || tonic::Status::deadline_exceeded("the service stalled the reply");
            let take = async {
                let mut req = tonic::Request::new(request);
                req.set_timeout(deadline);
                let reply = tokio::time::timeout(TAKE_IDLE, client.take(req))
                    .await
                    .map_err(|_| stalled())??;
                let mut stream = TakenBlocks::new(reply.into_inner());
                // Written as they come: at most one block is held here.
                while let Some(b) = tokio::time::timeout(TAKE_IDLE, stream.next())
                    .await
                    .map_err(|_| stalled())??
                {
                    let done = self.write_taken(dst, part, &b)?;
                    need[base + done] = false;
                }
                Ok::<_, tonic::Status>(())
            };
            let outcome = self.client.runtime.block_on(async {
                tokio::time::timeout(deadline, take)
                    .await
                    .unwrap_or_else(|_| Err(stalled()))
            });
            match outcome {
                Ok(()) => self.counters.breaker.succeeded(),
                Err(status) => {
                    self.counters.failed(
                        &self.client.addr,
                        "take",
                        "those blocks come over the wire",
                        &status,
                    );
                    // What was written before the failure stays taken.
                }
            }
        }
        Ok(need)
    }

    /// Checks one returned block against the hash it was asked for and writes it; returns its
    /// position in `part`. A wrong block ends the call: it and the rest come over the wire.
    fn write_taken(
        &self,
        dst: &(impl BlockSink + Sync + ?Sized),
        part: &[AnnouncedBlock],
        b: &pb::TakenBlock,
    ) -> Result<usize, tonic::Status> {
        let (pos, a) = checked_block(part, b).map_err(tonic::Status::data_loss)?;
        dst.write_block(&b.data, a.index.saturating_mul(BLOCK_SIZE as u64))
            .map_err(|e| tonic::Status::internal(format!("writing a taken block failed: {e}")))?;
        self.counters.dedup_blocks.fetch_add(1, Ordering::Relaxed);
        self.counters
            .dedup_bytes
            .fetch_add(b.data.len() as u64, Ordering::Relaxed);
        Ok(pos)
    }

    /// Queues a block that arrived over the wire and was verified against `hash` for the store
    /// (waiting while the queue is full). Only blocks that can be announced are kept (full
    /// ones, long tails). The queue holds `bytes` itself, not a copy: a fan-out's fetch threads
    /// and the streams' workers wait here while the service is busy, and a copy each made a
    /// receiver's peak heap about 70 MiB higher.
    pub fn insert_received(&self, hash: &BlockHash, bytes: Bytes) -> crate::cas::Result<()> {
        if !crate::cas::storable(bytes.len()) || self.counters.breaker.is_open() {
            return Ok(());
        }
        let queue = self.puts.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(queue) = queue {
            // Fails only once the workers are gone (the session finished): dropped, a cache.
            let _ = queue.blocking_send((*hash, bytes));
        }
        Ok(())
    }

    pub fn counters(&self) -> DedupCounters {
        let c = &self.counters;
        DedupCounters {
            dedup_blocks: c.dedup_blocks.load(Ordering::Relaxed),
            dedup_bytes: c.dedup_bytes.load(Ordering::Relaxed),
            // The service checks proofs; it does not tell a refused proof from an absent block.
            proofs_rejected: 0,
            blocks_inserted: c.blocks_inserted.load(Ordering::Relaxed),
            corrupt_discarded: 0,
        }
    }
}

async fn put(client: &NodeStoreClient, counters: &Counters, hash: BlockHash, data: Bytes) {
    let mut c = client.client.clone();
    let mut req = tonic::Request::new(pb::PutRequest {
        hash: hash.as_bytes().to_vec(),
        data,
    });
    req.set_timeout(CALL_TIMEOUT);
    if counters.breaker.is_open() {
        return;
    }
    let reply = tokio::time::timeout(CALL_TIMEOUT, c.put(req))
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("the Put stalled")));
    match reply {
        // The service says "stored", never whether the block was new (that would tell this
        // client what other tenants hold).
        Ok(r) if r.get_ref().inserted => {
            counters.breaker.succeeded();
            counters.blocks_inserted.fetch_add(1, Ordering::Relaxed);
        }
        Ok(_) => counters.breaker.succeeded(),
        Err(status) => counters.failed(&client.addr, "put", "the block is not stored", &status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(position: u32, data: &[u8], more: bool) -> pb::TakenBlock {
        pb::TakenBlock {
            position,
            data: bytes::Bytes::copy_from_slice(data),
            more,
        }
    }

    #[test]
    fn pieces_make_whole_blocks_and_a_whole_block_passes_as_is() {
        let mut p = Pieces::default();
        assert_eq!(p.push(piece(3, b"ab", true)), Ok(None));
        assert_eq!(p.push(piece(3, b"cd", true)), Ok(None));
        assert_eq!(
            p.push(piece(3, b"e", false)),
            Ok(Some(piece(3, b"abcde", false)))
        );
        assert_eq!(p.finish(), Ok(()));
        // A server that predates pieces: one message per block.
        assert_eq!(
            p.push(piece(0, b"xyz", false)),
            Ok(Some(piece(0, b"xyz", false)))
        );
        assert_eq!(p.finish(), Ok(()));
    }

    #[test]
    fn malformed_pieces_are_the_services_error() {
        let mut p = Pieces::default();
        assert_eq!(p.push(piece(1, b"ab", true)), Ok(None));
        assert_eq!(
            p.push(piece(2, b"cd", false)),
            Err("the pieces of two blocks interleave")
        );

        let mut p = Pieces::default();
        assert_eq!(p.push(piece(1, b"ab", true)), Ok(None));
        assert_eq!(p.finish(), Err("a reply ended inside a block"));

        let mut p = Pieces::default();
        let half = vec![0u8; BLOCK_SIZE / 2];
        assert_eq!(p.push(piece(0, &half, true)), Ok(None));
        assert_eq!(p.push(piece(0, &half, true)), Ok(None));
        assert_eq!(
            p.push(piece(0, b"1", false)),
            Err("a returned block is too long")
        );
        let mut p = Pieces::default();
        assert_eq!(
            p.push(piece(0, &vec![0u8; BLOCK_SIZE + 1], false)),
            Err("a returned block is too long")
        );
    }
}
