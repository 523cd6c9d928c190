//! Per-node content-addressed block store (issue 5).
