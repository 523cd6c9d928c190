//! The status side of reconcile: the writer (`writer`: one status patch, its precondition, the
//! Events) and the patch budget (`limiter`: how often progress alone may be written).

mod limiter;
mod writer;

pub use limiter::{DEFAULT_PATCH_QPS, MIN_PROGRESS_INTERVAL, PatchLimiter, progress_only};
pub use writer::{Written, record, write_status};
