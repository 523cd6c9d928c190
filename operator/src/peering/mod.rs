//! Cross-cluster Transfers: the API two operators speak (authenticated by the CA bundles in
//! their `Peer` objects), the client and server of it, and what the destination half remembers
//! of its source half. See docs/cross-cluster.md.

pub mod admission;
pub mod client;
pub mod leader;
pub mod observe;
pub mod registry;
pub mod server;
pub mod trust;
pub mod wire;
