//! ferry-mover: the data plane of ferry.
//!
//! The same library backs every `ferry-mover` subcommand:
//! - [`tree`]: walking a source tree and touching a destination tree only beneath its root handle;
//! - [`copy`]: the local parallel copy engine (also the write path of network transfers);
//! - [`protocol`]: the data protocol without I/O: the frame codec ([`wire`]) and each end's rules;
//! - [`net`]: mutual TLS, certificates and peer identities (from `ferry-proto`);
//! - [`session`]: the drivers: the sender and receiver over N parallel streams;
//! - [`digest`]: the end-to-end transfer digest both ends compute and compare;
//! - [`kind`]: where a failure lies (error kinds, exit status);
//! - [`progress`]: the gRPC progress service;
//! - [`quantity`]: byte quantities (`50M`, `1Gi`, from `ferry-proto`);
//! - [`limiter`]: bandwidth limits for send and copy;
//! - [`cas`]: the per-node content-addressed block store;
//! - [`report`]: summaries (`--json`) and the TTY progress bar;
//! - [`cli`]: flag parsing and dispatch for the binary.

pub mod cas;
pub mod cli;
pub mod copy;
pub mod digest;
pub mod kind;
pub mod limiter;
pub mod node;
pub mod progress;
pub mod protocol;
pub mod report;
pub mod session;
pub mod tree;

/// The contract shared with the operator, under the names the mover has always used.
pub use ferry_proto::{net, quantity};
/// The frame codec, under the name the rest of the mover uses.
pub use protocol::wire;
