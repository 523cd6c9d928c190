//! `kubectl ferry`, the kubectl plugin (`kubectl-ferry`): Transfers with their figures (`get`),
//! a live progress line (`watch`), the whole story of one Transfer (`describe`) and its movers'
//! logs (`logs`), and the node services' block stores (`nodes`); it also acts on one:
//! `trigger`, `suspend`, `resume`, `delete`, and creates one from arguments (`cp`). See
//! docs/kubectl-ferry.md.
//!
//! The rendering modules (`format`, `table`, `get`, `watch`, `describe`, `logs`, `nodes`) and
//! `act` (what a verb changes) and `cp` (the Transfer its arguments describe) are pure functions of the objects read from the API server; `commands` reads those objects and writes
//! the output. The binary parses flags and maps outcomes to exit codes.

pub mod act;
pub mod commands;
pub mod complete;
pub mod cp;
pub mod describe;
pub mod format;
pub mod get;
pub mod logs;
pub mod nodes;
pub mod table;
pub mod watch;

use std::path::PathBuf;

/// What can go wrong in a command, each naming what it was about.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no kubeconfig: KUBECONFIG is not set and {0} does not exist (kubectl ferry reads the same kubeconfig as kubectl)"
    )]
    NoKubeconfig(String),
    #[error("the kubeconfig {} named by KUBECONFIG does not exist", .0.display())]
    KubeconfigMissing(PathBuf),
    #[error("failed to load the kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("failed to create a client for the cluster")]
    Client(#[source] kube::Error),
    #[error(
        "this cluster does not serve Transfers (transfers.ferry.dev/v1alpha1): install ferry's CRD (crds/ferry.dev_transfers.yaml or the Helm chart)"
    )]
    NoCrd,
    #[error("transfer {name:?} not found in namespace {namespace:?}")]
    NotFound { namespace: String, name: String },
    #[error("failed to {what}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to watch transfer {namespace}/{name}")]
    Watch {
        namespace: String,
        name: String,
        #[source]
        source: kube::runtime::watcher::Error,
    },
    #[error("the watch of transfer {namespace}/{name} ended")]
    WatchEnded { namespace: String, name: String },
    #[error(
        "transfer {namespace}/{name} has no mover pods{role} (the pods of a failed attempt are deleted at once; `kubectl ferry describe {name} -n {namespace}` shows their last error)"
    )]
    NoPods {
        namespace: String,
        name: String,
        role: String,
    },
    #[error(transparent)]
    Refused(#[from] act::Refused),
    #[error(transparent)]
    Cp(#[from] cp::CpError),
    #[error("the Transfer the arguments describe is not one")]
    Spec(#[source] serde_json::Error),
    #[error("transfer {namespace}/{name} was still there after {waited}")]
    NotDeleted {
        namespace: String,
        name: String,
        waited: String,
    },
    #[error("failed to write the output")]
    Output(#[source] std::io::Error),
}
