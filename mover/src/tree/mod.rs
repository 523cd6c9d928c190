//! Source scanning, destination confinement and metadata: the tree layer shared by the local copy
//! engine and the network receiver.
//!
//! - [`RelPath`]: a validated relative path (from a user or a peer);
//! - [`Meta`]: what is preserved about an entry;
//! - [`Scanner`]: streaming walk of a source tree, optionally through a [`Filter`];
//! - [`DirWalk`]: its directories only, with their listings (the sender's final metadata pass);
//! - [`DestRoot`]: every destination operation, confined beneath one directory handle;
//! - [`PeerPath`] and [`PeerDest`]: a path from a network peer, and the receiver's destination
//!   that takes such paths (with a cache of open directories);
//! - [`StagedFile`]: a file written under a temporary name and renamed into place on commit;
//! - [`data`]: the data-copy fast paths (reflink, holes, copy_file_range, read/write).

pub mod confine;
pub mod data;
pub mod dest;
pub mod dest_lock;
mod dircache;
pub mod dirwalk;
pub mod meta;
pub mod peer_dest;
pub mod peer_path;
pub mod policy;
pub mod relpath;
pub mod scan;
pub mod subpath;

pub use confine::Resolve;
pub use data::{CopyCaps, Method};
pub use dest::{
    CommitError, DestError, DestOptions, DestRoot, DirFd, FileOpen, NonEmptyDir, Placed, Replace,
    StagedFile, TEMP_PREFIX, is_temp_name,
};
pub use dirwalk::{DirVisit, DirWalk};
pub use ferry_proto::filter::{self, Filter, FilterError};
pub use meta::{Kind, Meta};
pub use peer_dest::PeerDest;
pub use peer_path::{PeerPath, PeerPathError};
pub use policy::{MetaError, MetaPolicy};
pub use relpath::{PathError, RelPath};
pub use scan::{Entry, ScanError, ScanEvent, Scanner, split_source};
