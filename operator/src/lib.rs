//! ferry-operator: the control plane. The Transfer CRD, reconcile, placement, PKI and status arrive
//! with the operator issues; this crate exists now so the workspace layout is final.

/// The API group all ferry resources live in.
pub const API_GROUP: &str = "ferry.dev";
/// The version of the Transfer API.
pub const API_VERSION: &str = "v1alpha1";
