//! Where a receiver's blocks belong at its node's service, as its operator states it in the
//! receiver's certificate beside the identity (a second URI SAN):
//! `urn:ferry:cluster:<cluster>:tenant:<namespace>:run:<run>:store:<shared|run>[:node:<node>]`.
//!
//! - `namespace`: the Transfer's; with one dedup domain per namespace, the service keeps this
//!   client's blocks apart from every other namespace's.
//! - `run`: the fan-out run (every sibling of one run carries the same), or the Transfer's own
//!   run when it has one destination. Only a client naming a run may make a Take that waits for
//!   blocks, and only a Put of the same run wakes it: the siblings of one run pass blocks to
//!   each other, and no other tenant can time another's Puts.
//! - `store`: `shared` when the Transfer asked for dedup (its blocks join its domain's store);
//!   `run` when it did not (a fan-out still passes blocks between its destinations, in a store
//!   of that run alone, which no other Transfer sees and which goes once the run is done).
//! - `node`: the node the receiver runs on, when the operator knows it as it issues the
//!   certificate (a host path's node, a fan-out child's, a claim already in use on a node). A
//!   service serves such a client fully on that node only; on any other node the client may
//!   only take blocks (what a fan-out sibling does there), never put them. A receiver whose
//!   node the scheduler picks after its certificate exists names none.
//!
//! The parts are checked like transfer ids (1 to 128 of A-Z a-z 0-9 '.' '_' '-'), so the URI
//! parses one way only; the certificate's signature is what makes it true.

use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

const PREFIX: &str = "urn:ferry:cluster:";

/// Which store a client's blocks go to and come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreScope {
    /// Its dedup domain's store (the whole node's, or its namespace's).
    Shared,
    /// A store of its run alone.
    Run,
}

impl StoreScope {
    fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Run => "run",
        }
    }
}

/// A receiver's place among the node service's clients.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenancy {
    pub cluster: String,
    pub namespace: String,
    pub run: String,
    pub store: StoreScope,
    pub node: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "invalid {what} {value:?} for a tenancy: use 1 to 128 characters (a node's name 253) from \
     A-Z a-z 0-9 '.' '_' '-'"
)]
pub struct TenancyError {
    what: &'static str,
    value: String,
}

fn part(what: &'static str, value: &str) -> Result<String, TenancyError> {
    // A node's name is a DNS subdomain, up to 253 characters.
    let max = if what == "node" { 253 } else { 128 };
    let ok = !value.is_empty()
        && value.len() <= max
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(value.to_owned())
    } else {
        Err(TenancyError {
            what,
            value: value.to_owned(),
        })
    }
}

impl Tenancy {
    pub fn new(
        cluster: &str,
        namespace: &str,
        run: &str,
        store: StoreScope,
    ) -> Result<Self, TenancyError> {
        Ok(Self {
            cluster: part("cluster", cluster)?,
            namespace: part("namespace", namespace)?,
            run: part("run", run)?,
            store,
            node: None,
        })
    }

    /// The same tenancy bound to the receiver's node.
    pub fn on_node(self, node: &str) -> Result<Self, TenancyError> {
        Ok(Self {
            node: Some(part("node", node)?),
            ..self
        })
    }

    /// Whether a client of this tenancy is served fully by the service of `node` (a client
    /// that states no node is taken to run where it connects).
    pub fn is_local_to(&self, node: &str) -> bool {
        self.node.as_deref().is_none_or(|n| n == node)
    }

    pub fn uri(&self) -> String {
        let mut uri = format!(
            "{PREFIX}{}:tenant:{}:run:{}:store:{}",
            self.cluster,
            self.namespace,
            self.run,
            self.store.as_str()
        );
        if let Some(node) = &self.node {
            uri.push_str(":node:");
            uri.push_str(node);
        }
        uri
    }

    /// The tenancy a URI states, if it is one.
    pub fn parse_uri(uri: &str) -> Option<Self> {
        let rest = uri.strip_prefix(PREFIX)?;
        let (cluster, rest) = rest.split_once(":tenant:")?;
        let (namespace, rest) = rest.split_once(":run:")?;
        let (run, rest) = rest.split_once(":store:")?;
        let (store, node) = match rest.split_once(":node:") {
            Some((store, node)) => (store, Some(node)),
            None => (rest, None),
        };
        let store = match store {
            "shared" => StoreScope::Shared,
            "run" => StoreScope::Run,
            _ => return None,
        };
        let tenancy = Self::new(cluster, namespace, run, store).ok()?;
        match node {
            Some(node) => tenancy.on_node(node).ok(),
            None => Some(tenancy),
        }
    }

    /// The tenancy a DER certificate states (its first), if any.
    pub fn from_cert_der(der: &[u8]) -> Option<Self> {
        let (_, cert) = X509Certificate::from_der(der).ok()?;
        let san = cert.subject_alternative_name().ok()??;
        san.value.general_names.iter().find_map(|n| match n {
            GeneralName::URI(u) => Self::parse_uri(u),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenancy_round_trips_and_parses_one_way_only() {
        let t = Tenancy::new("east", "ml-team", "5f0c-uid.3", StoreScope::Run).unwrap();
        assert_eq!(
            t.uri(),
            "urn:ferry:cluster:east:tenant:ml-team:run:5f0c-uid.3:store:run"
        );
        assert_eq!(Tenancy::parse_uri(&t.uri()), Some(t));
        for bad in [
            "urn:ferry:cluster:east:tenant:a:b:run:r:store:run",
            "urn:ferry:cluster:east:tenant:ns:run:r:store:other",
            "urn:ferry:cluster:east:transfer:u:attempt:1:role:receiver",
            "urn:ferry:cluster::tenant:ns:run:r:store:shared",
        ] {
            assert_eq!(Tenancy::parse_uri(bad), None, "{bad}");
        }
        assert!(Tenancy::new("east", "a:b", "r", StoreScope::Shared).is_err());
    }

    #[test]
    fn a_tenancy_bound_to_a_node_is_local_there_only() {
        let t = Tenancy::new("east", "ml", "r-1", StoreScope::Shared)
            .and_then(|t| t.on_node("gpu-1.pool"))
            .unwrap();
        assert_eq!(
            t.uri(),
            "urn:ferry:cluster:east:tenant:ml:run:r-1:store:shared:node:gpu-1.pool"
        );
        assert_eq!(Tenancy::parse_uri(&t.uri()), Some(t.clone()));
        assert!(t.is_local_to("gpu-1.pool"));
        assert!(!t.is_local_to("gpu-2.pool"));
        let unbound = Tenancy::new("east", "ml", "r-1", StoreScope::Shared).unwrap();
        assert!(unbound.is_local_to("anywhere"));
        for bad in [
            "urn:ferry:cluster:east:tenant:ml:run:r-1:store:shared:node:",
            "urn:ferry:cluster:east:tenant:ml:run:r-1:store:shared:node:a:b",
            "urn:ferry:cluster:east:tenant:ml:run:r-1:store:other:node:a",
        ] {
            assert_eq!(Tenancy::parse_uri(bad), None, "{bad}");
        }
    }
}
