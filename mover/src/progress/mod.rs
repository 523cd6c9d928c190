//! Live progress of one mover: lock-free counters the session updates, snapshots for the
//! `--json` summary, and the gRPC `Progress` service that serves them over mutual TLS.

mod counters;
mod service;

pub use counters::{MAX_UNREADABLE_PATHS, Phase, Progress, Snapshot, Unreadable};
pub use ferry_proto::progress::{ConnectError, connect_progress};
pub use service::{ProgressServiceError, serve_progress, serve_progress_of_sessions};
