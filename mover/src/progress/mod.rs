//! gRPC progress service (issue 4).
