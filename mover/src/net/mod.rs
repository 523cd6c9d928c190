//! Mutual TLS, certificates and peer identities (issue 4).
