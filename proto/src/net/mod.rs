//! Mutual TLS for the data and progress ports: certificate generation, peer identities and the
//! rustls configurations (TLS 1.3 only, AES-128-GCM first, aws-lc-rs).
//!
//! A peer is trusted when its certificate chains to the transfer's CA *and* its URI SAN names the
//! same transfer id and a role this endpoint accepts (the opposite mover role, or `operator` on a
//! progress port). Anything else fails inside the TLS handshake with an error naming both
//! identities.

mod admission;
mod certs;
mod grpc;
mod identity;
mod node_tls;
mod tenancy;
mod tls;
mod transport;
mod verifier;

pub use admission::{
    AcceptLimits, Admission, ConnActivity, ConnectionSlot, ConnectionSlots, InUse,
    PendingHandshakes,
};
pub use certs::{Ca, CertsError, GeneratedCerts, generate_certs, generate_certs_in, write_certs};
pub use grpc::{PeerIdentity, TlsConn, tls_channel, tls_incoming};
pub use identity::{Identity, IdentityError, NODE_SERVICE_ID, Role, Scope};
pub use node_tls::{node_client_config, node_server_config};
pub use tenancy::{StoreScope, Tenancy, TenancyError};
pub use tls::{
    PeerTrust, TlsError, TlsFiles, client_config, load_files, own_transfer_id, provider,
    server_config, with_peer,
};
pub use transport::{
    TransportError, accept_tls, connect_tls, connect_tls_probed, connect_tls_retrying,
};
pub use verifier::{PinnedVerifier, Pinning, TrustAnchor};
