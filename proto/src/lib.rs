//! ferry-proto: the contract between ferry's two binaries, which both use and neither owns.
//!
//! - the generated messages: [`wire::v1`] (inside data-protocol frames), [`progress::v1`] (the
//!   progress service) and [`blockstore::v1`] (the node service's block store);
//! - [`net`]: identities, certificates, the one certificate verifier and the rustls
//!   configurations, connection setup with deadlines and handshake admission;
//! - [`kind`]: where a failure lies and whether a retry can help (the error-kind vocabulary);
//! - [`quantity`]: byte quantities (`50M`, `1Gi`);
//! - [`filter`]: the `--exclude` / `--include` rule syntax;
//! - [`mover_args`]: the command line the operator gives a mover pod, as one type;
//! - [`progress`]: the progress client;
//! - [`error_chain`] and [`shutdown`]: an error's causes on one line, one shutdown signal;
//! - [`exposition`]: the metrics and health endpoint both binaries serve.

pub mod error_chain;
pub mod exposition;
pub mod filter;
pub mod kind;
pub mod mover_args;
pub mod net;
pub mod progress;
pub mod quantity;
pub mod shutdown;

pub use error_chain::error_chain;

/// Message bodies carried inside data-protocol frames (`ferry.wire.v1`, see docs/protocol.md).
pub mod wire {
    #[allow(clippy::all, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("ferry.wire.v1");
    }
}

/// The node service's block store API and its messages (`ferry.blockstore.v1`).
pub mod blockstore {
    #[allow(clippy::all, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("ferry.blockstore.v1");
    }
}
