//! Which store a client's blocks go to and come from, by the tenancy its certificate states
//! ([`crate::net::Tenancy`]):
//!
//! - a Transfer with dedup, on a service with one dedup domain for the cluster: the node's
//!   store (the directory the service was given);
//! - the same with one domain per namespace (`--dedup-domain namespace`):
//!   `domains/<namespace>/`, a store of its own on the same volume, so tenants of different
//!   namespaces learn nothing of each other's data;
//! - a fan-out without dedup: `runs/<run>/`, a store of its run alone, which its siblings share
//!   and no other Transfer sees, removed once no client used it for [`RUN_STORE_IDLE`].
//!
//! A client whose certificate states no tenancy (issued by an operator that predates it) uses
//! the node's store where there is one domain, and none where there is one per namespace.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::Status;

use crate::cas::{CasOptions, CasStore};
use crate::net::{StoreScope, Tenancy};

/// How long a run's store stays after its last use (a fan-out's retries and late siblings
/// come within minutes; a new run has a store of its own).
pub const RUN_STORE_IDLE: Duration = Duration::from_secs(3600);

/// How the service separates tenants' blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DedupDomain {
    /// One store for every namespace: the most hits; a tenant holding a block's content can
    /// learn that the node holds it too.
    Cluster,
    /// A store per namespace.
    Namespace,
}

pub struct Stores {
    root: Arc<CasStore>,
    dir: PathBuf,
    opts: CasOptions,
    domain: DedupDomain,
    namespaces: Mutex<HashMap<String, Arc<CasStore>>>,
    runs: Mutex<HashMap<String, (Arc<CasStore>, Instant)>>,
}

impl Stores {
    pub fn new(root: Arc<CasStore>, dir: PathBuf, opts: CasOptions, domain: DedupDomain) -> Self {
        Self {
            root,
            dir,
            opts,
            domain,
            namespaces: Mutex::new(HashMap::new()),
            runs: Mutex::new(HashMap::new()),
        }
    }

    /// The node's store (the cluster domain's).
    pub fn root(&self) -> &Arc<CasStore> {
        &self.root
    }

    /// The store of a client with `tenancy` (opened on first use: call from a blocking thread).
    pub fn of(&self, tenancy: Option<&Tenancy>) -> Result<Arc<CasStore>, Status> {
        match (tenancy, self.domain) {
            (Some(t), _) if t.store == StoreScope::Run => self.run(&t.run),
            (Some(t), DedupDomain::Namespace) => self.namespace(&t.namespace),
            (_, DedupDomain::Cluster) => Ok(self.root.clone()),
            (None, DedupDomain::Namespace) => Err(Status::permission_denied(
                "this node service keeps a store per namespace and the client's certificate \
                 names none (issued by an older operator): no dedup",
            )),
        }
    }

    fn open(&self, dir: PathBuf) -> Result<Arc<CasStore>, Status> {
        CasStore::open_with(&dir, self.opts.clone())
            .map(Arc::new)
            .map_err(|e| Status::unavailable(format!("block store unavailable: {e}")))
    }

    fn namespace(&self, ns: &str) -> Result<Arc<CasStore>, Status> {
        let mut map = self.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(ns) {
            return Ok(s.clone());
        }
        let store = self.open(self.dir.join("domains").join(ns))?;
        map.insert(ns.to_owned(), store.clone());
        Ok(store)
    }

    fn run(&self, run: &str) -> Result<Arc<CasStore>, Status> {
        let mut map = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, used)) = map.get_mut(run) {
            *used = Instant::now();
            return Ok(s.clone());
        }
        let store = self.open(self.dir.join("runs").join(run))?;
        map.insert(run.to_owned(), (store.clone(), Instant::now()));
        Ok(store)
    }

    /// Every store open now (for garbage collection).
    pub fn all(&self) -> Vec<Arc<CasStore>> {
        let mut all = vec![self.root.clone()];
        all.extend(
            self.namespaces
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned(),
        );
        all.extend(
            self.runs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(|(s, _)| s.clone()),
        );
        all
    }

    /// Removes the stores of runs no client used for `idle` (and those left on the volume by an
    /// earlier process, by their directory's age). Returns how many went. Blocking.
    pub fn remove_idle_runs(&self, idle: Duration) -> usize {
        let mut removed = 0;
        let runs_dir = self.dir.join("runs");
        let mut map = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        let stale: Vec<String> = map
            .iter()
            // Held by a request right now (the map holds one reference): kept.
            .filter(|(_, (s, used))| used.elapsed() >= idle && Arc::strong_count(s) == 1)
            .map(|(k, _)| k.clone())
            .collect();
        for run in stale {
            map.remove(&run);
            if std::fs::remove_dir_all(runs_dir.join(&run)).is_ok() {
                removed += 1;
            }
        }
        let Ok(entries) = std::fs::read_dir(&runs_dir) else {
            return removed;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= idle);
            if !map.contains_key(&name) && old && std::fs::remove_dir_all(e.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stores(domain: DedupDomain) -> (tempfile::TempDir, Stores) {
        let dir = tempfile::tempdir().unwrap_or_else(|_| unreachable!());
        let opts = CasOptions {
            cap_bytes: Some(1 << 30),
            fsync: false,
        };
        let root = Arc::new(
            CasStore::open_with(dir.path(), opts.clone()).unwrap_or_else(|_| unreachable!()),
        );
        let s = Stores::new(root, dir.path().to_owned(), opts, domain);
        (dir, s)
    }

    fn tenancy(ns: &str, run: &str, store: StoreScope) -> Tenancy {
        Tenancy::new("c", ns, run, store).unwrap_or_else(|_| unreachable!())
    }

    #[test]
    fn each_tenancy_gets_its_store() {
        let (dir, s) = stores(DedupDomain::Namespace);
        let a = s
            .of(Some(&tenancy("a", "r1", StoreScope::Shared)))
            .unwrap_or_else(|_| unreachable!());
        let b = s
            .of(Some(&tenancy("b", "r1", StoreScope::Shared)))
            .unwrap_or_else(|_| unreachable!());
        assert!(!Arc::ptr_eq(&a, &b));
        assert!(Arc::ptr_eq(
            &a,
            &s.of(Some(&tenancy("a", "r2", StoreScope::Shared)))
                .unwrap_or_else(|_| unreachable!())
        ));
        assert!(dir.path().join("domains/a/FERRY-CAS").exists());
        let run = s
            .of(Some(&tenancy("a", "r1", StoreScope::Run)))
            .unwrap_or_else(|_| unreachable!());
        assert!(!Arc::ptr_eq(&run, &a));
        assert!(dir.path().join("runs/r1/FERRY-CAS").exists());
        assert_eq!(
            s.of(None).map(|_| ()).unwrap_err().code(),
            tonic::Code::PermissionDenied
        );

        let (_dir, s) = stores(DedupDomain::Cluster);
        let a = s
            .of(Some(&tenancy("a", "r1", StoreScope::Shared)))
            .unwrap_or_else(|_| unreachable!());
        assert!(Arc::ptr_eq(&a, s.root()));
        assert!(Arc::ptr_eq(
            &s.of(None).unwrap_or_else(|_| unreachable!()),
            s.root()
        ));
    }

    #[test]
    fn a_runs_store_goes_once_idle_and_unused() {
        let (dir, s) = stores(DedupDomain::Cluster);
        let held = s
            .of(Some(&tenancy("a", "r1", StoreScope::Run)))
            .unwrap_or_else(|_| unreachable!());
        assert_eq!(s.remove_idle_runs(Duration::ZERO), 0, "in use");
        drop(held);
        assert_eq!(
            s.remove_idle_runs(Duration::from_secs(3600)),
            0,
            "used just now"
        );
        assert_eq!(s.remove_idle_runs(Duration::ZERO), 1);
        assert!(!dir.path().join("runs/r1").exists());
        // Left by an earlier process.
        std::fs::create_dir_all(dir.path().join("runs/old/blocks"))
            .unwrap_or_else(|_| unreachable!());
        assert_eq!(s.remove_idle_runs(Duration::ZERO), 1);
        assert!(
            dir.path().join("FERRY-CAS").exists(),
            "the node's store stays"
        );
    }
}
