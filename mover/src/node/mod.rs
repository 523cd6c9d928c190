//! The node service (`ferry-mover node serve`, run by the `ferry-node` DaemonSet): it owns its
//! node's block store and serves it over mutual TLS to the receivers on that node, whatever
//! their namespace, so tenant pods never mount the store.
//!
//! - [`service`]: the gRPC `BlockStore` server: proven blocks out, verified blocks in, figures;
//! - [`stores`]: which store a client's blocks go to (its domain's, or its run's);
//! - [`shares`], [`outgoing`], [`gate`], [`waiters`]: what keeps one client from taking the
//!   service away from the others (per-client shares, send deadlines, the Put gate, wake-ups
//!   by hash);
//! - [`client`]: a receiver's side of it (what a receiver asks of its block store, over the wire);
//! - [`prepare`]: makes the store directory usable by the unprivileged service (init container);
//! - [`swarm`]: fan-out, a receiver taking blocks its fellow destinations own from their services;
//! - [`counters`], [`metrics`]: what the service counts, and the store's figures in Prometheus' text
//!   format;
//! - [`run`]: serves, reloads a renewed certificate, collects garbage on its own schedule.

pub mod client;
pub mod counters;
pub mod gate;
pub mod metrics;
pub mod outgoing;
pub mod prepare;
mod run;
pub mod service;
pub mod shares;
pub mod stores;
pub mod swarm;
pub mod waiters;

pub use run::{NodeServiceConfig, serve};
pub use stores::DedupDomain;

/// Most blocks one `Take` may ask for: the receiver's own bound for one announce.
pub const MAX_TAKE: usize = crate::cas::dedup::MAX_STORE_READS_PER_ANNOUNCE;
/// The largest message either side sends: one 4 MiB block and its framing.
pub const MAX_MESSAGE: usize = crate::cas::BLOCK_SIZE + 64 * 1024;
