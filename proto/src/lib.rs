//! ferry-proto: protobuf message types and the gRPC services (progress, node block store),
//! generated at build time.

#![allow(clippy::all, missing_docs)]

/// Message bodies carried inside data-protocol frames (`ferry.wire.v1`, see docs/protocol.md).
pub mod wire {
    pub mod v1 {
        tonic::include_proto!("ferry.wire.v1");
    }
}

/// The progress service and its messages (`ferry.progress.v1`).
pub mod progress {
    pub mod v1 {
        tonic::include_proto!("ferry.progress.v1");
    }
}

/// The node service's block store API and its messages (`ferry.blockstore.v1`).
pub mod blockstore {
    pub mod v1 {
        tonic::include_proto!("ferry.blockstore.v1");
    }
}
