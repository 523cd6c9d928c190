//! Who may call this cluster's cross-cluster API, and whom this cluster's operator believes when
//! it calls another: a Peer's CA is trusted only for the peering identity of that Peer's cluster
//! (`urn:ferry:cluster:<clusterName>:transfer:ferry-peering:attempt:0:role:operator`), never for
//! this cluster's identities or a mover's.

use std::sync::Arc;

use ferry_proto::net::{Identity, Pinning, Role, TrustAnchor};
use kube::runtime::reflector::Store;
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::api::Peer;

/// The transfer id of the identity operators use toward each other.
pub const PEERING_ID: &str = "ferry-peering";

/// The identity `cluster`'s operator presents on the cross-cluster API.
pub fn peering_identity(cluster: &str) -> Result<Identity, ferry_proto::net::IdentityError> {
    Identity::scoped(PEERING_ID, Role::Operator, cluster, 0)
}

/// A Peer, parsed: its object name, its cluster name, its CA certificates and its endpoint.
#[derive(Debug, Clone)]
pub struct PeerEntry {
    pub name: String,
    pub cluster: String,
    pub roots: Arc<RootCertStore>,
    pub endpoint: String,
}

/// Reads a Peer; the error says what is wrong with it.
pub fn peer_entry(p: &Peer) -> Result<PeerEntry, String> {
    let name = p.metadata.name.clone().unwrap_or_default();
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(p.spec.ca_bundle.as_bytes()) {
        let c = c.map_err(|e| format!("Peer {name}: caBundle is not PEM: {e}"))?;
        roots
            .add(c)
            .map_err(|e| format!("Peer {name}: caBundle holds an unusable certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("Peer {name}: caBundle holds no certificate"));
    }
    Ok(PeerEntry {
        name,
        cluster: p.spec.cluster_name.clone(),
        roots: Arc::new(roots),
        endpoint: p.spec.endpoint.clone(),
    })
}

/// The Peers naming `cluster` (several are allowed: one per name the Transfers use).
pub fn peers_of_cluster(store: &Store<Peer>, cluster: &str) -> Vec<Arc<Peer>> {
    store
        .state()
        .into_iter()
        .filter(|p| p.spec.cluster_name == cluster)
        .collect()
}

fn general(e: impl std::fmt::Display) -> rustls::Error {
    rustls::Error::General(e.to_string())
}

/// The peering identity a certificate claims, and its cluster (read before the chain is
/// checked only to pick the CA that must have signed it).
fn claimed_peer(end_entity: &CertificateDer<'_>) -> Result<(Identity, String), rustls::Error> {
    let id = Identity::from_cert_der(end_entity).map_err(general)?;
    match &id.scope {
        Some(s) if id.role == Role::Operator && id.transfer_id == PEERING_ID => {
            let cluster = s.cluster.clone();
            Ok((id, cluster))
        }
        _ => Err(general(format!(
            "certificate identity {id} is not a ferry operator's peering identity"
        ))),
    }
}

/// The server's rule for callers: the caller's claimed cluster must have a Peer here, and its
/// certificate must chain to that Peer's CA bundle. Unknown clusters are refused in the
/// handshake, before any request is read.
#[derive(Debug)]
pub struct CallerPinning {
    pub peers: Store<Peer>,
    pub local_cluster: String,
}

impl Pinning for CallerPinning {
    fn anchors(&self, end_entity: &CertificateDer<'_>) -> Result<Vec<TrustAnchor>, rustls::Error> {
        let (_, cluster) = claimed_peer(end_entity)?;
        if cluster == self.local_cluster {
            return Err(general(format!(
                "a caller claims to be this cluster ({cluster}); only peers call this endpoint"
            )));
        }
        let peers = peers_of_cluster(&self.peers, &cluster);
        if peers.is_empty() {
            tracing::warn!(%cluster, "refused a caller from a cluster no Peer names");
            return Err(general(format!("no Peer names cluster {cluster}")));
        }
        // Any of this cluster's Peers may vouch (they should agree; during a CA rotation one
        // may already carry the new bundle).
        let mut anchors = Vec::new();
        let mut unusable = None;
        for p in peers {
            match peer_entry(&p) {
                Ok(entry) => anchors.push(TrustAnchor::of_peer(entry.roots, &cluster)?),
                Err(e) => unusable = Some(general(e)),
            }
        }
        match unusable {
            Some(e) if anchors.is_empty() => Err(e),
            _ => Ok(anchors),
        }
    }

    fn check(&self, _: &CertificateDer<'_>, _: &TrustAnchor) -> Result<(), rustls::Error> {
        // The claim that chose the anchor is the whole identity: a peering identity of the
        // cluster whose CA vouched for it.
        Ok(())
    }

    fn chain_refused(&self, end_entity: &CertificateDer<'_>) {
        if let Ok((_, cluster)) = claimed_peer(end_entity) {
            tracing::warn!(%cluster, "refused a caller whose certificate its Peer's caBundle does not vouch for");
        }
    }
}

/// The client's rule for a peer's endpoint: its certificate must chain to the Peer's CA bundle
/// and carry the peering identity of the Peer's cluster.
#[derive(Debug)]
pub struct EndpointPinning {
    pub peer: PeerEntry,
}

impl Pinning for EndpointPinning {
    fn anchors(&self, _: &CertificateDer<'_>) -> Result<Vec<TrustAnchor>, rustls::Error> {
        Ok(vec![TrustAnchor::of_peer(
            self.peer.roots.clone(),
            &self.peer.cluster,
        )?])
    }

    fn check(&self, end_entity: &CertificateDer<'_>, _: &TrustAnchor) -> Result<(), rustls::Error> {
        let (id, cluster) = claimed_peer(end_entity)?;
        if cluster != self.peer.cluster {
            return Err(general(format!(
                "the endpoint of Peer {} presented {id}, but the Peer names cluster {}",
                self.peer.name, self.peer.cluster
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PeerSpec;
    use ferry_proto::net::{Ca, PinnedVerifier};
    use kube::runtime::{reflector, watcher};
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{ServerName, UnixTime};
    use rustls::server::danger::ClientCertVerifier;

    fn ca(cluster: &str) -> Ca {
        Ca::new_valid_for(&format!("cluster {cluster}"), 1, 1).expect("ca")
    }

    /// A leaf of `ca` for `cluster`'s peering identity.
    fn leaf(ca: &Ca, cluster: &str) -> CertificateDer<'static> {
        let (cert, _) = ca
            .issue_for(&peering_identity(cluster).expect("id"))
            .expect("leaf");
        CertificateDer::from_pem_slice(cert.as_bytes()).expect("der")
    }

    fn peer(name: &str, cluster: &str, bundle: &[&Ca]) -> Peer {
        let mut p = Peer::new(
            name,
            PeerSpec {
                cluster_name: cluster.into(),
                ca_bundle: bundle.iter().map(|c| c.cert_pem()).collect(),
                endpoint: "127.0.0.1:1".into(),
            },
        );
        p.metadata.uid = Some(name.into());
        p
    }

    fn verifier(peers: &[Peer]) -> Arc<PinnedVerifier<CallerPinning>> {
        let (store, mut writer) = reflector::store();
        for p in peers {
            writer.apply_watcher_event(&watcher::Event::Apply(p.clone()));
        }
        PinnedVerifier::new(CallerPinning {
            peers: store,
            local_cluster: "east".into(),
        })
    }

    #[test]
    fn a_callers_ca_vouches_only_for_the_cluster_its_peer_names() {
        let (west, north) = (ca("west"), ca("north"));
        let v = verifier(&[peer("west", "west", &[&west])]);
        let now = UnixTime::now();
        v.verify_client_cert(&leaf(&west, "west"), &[], now)
            .expect("west's operator");
        // West's CA minting another cluster's (or this cluster's) identity, a stranger's CA.
        for (ca, cluster) in [(&west, "north"), (&west, "east"), (&north, "north")] {
            let e = v
                .verify_client_cert(&leaf(ca, cluster), &[], now)
                .unwrap_err();
            assert!(!e.to_string().is_empty());
        }
        // A stranger claiming west's name with its own CA.
        assert!(
            v.verify_client_cert(&leaf(&north, "west"), &[], now)
                .is_err()
        );
    }

    #[test]
    fn a_bundle_with_the_old_and_the_new_ca_accepts_both_during_a_rotation() {
        let (old, new, other) = (ca("west"), ca("west"), ca("west"));
        let v = verifier(&[peer("west", "west", &[&old, &new])]);
        let now = UnixTime::now();
        v.verify_client_cert(&leaf(&old, "west"), &[], now)
            .expect("old CA");
        v.verify_client_cert(&leaf(&new, "west"), &[], now)
            .expect("new CA");
        assert!(
            v.verify_client_cert(&leaf(&other, "west"), &[], now)
                .is_err()
        );
        // After the rotation the old CA is dropped from the bundle.
        let v = verifier(&[peer("west", "west", &[&new])]);
        assert!(v.verify_client_cert(&leaf(&old, "west"), &[], now).is_err());

        // The client side trusts the same bundle for the endpoint.
        let entry = peer_entry(&peer("west", "west", &[&old, &new])).expect("entry");
        let ev = PinnedVerifier::new(EndpointPinning { peer: entry });
        let name = ServerName::try_from("ferry-peer").expect("name");
        for ca in [&old, &new] {
            ev.verify_server_cert(&leaf(ca, "west"), &[], &name, &[], now)
                .expect("endpoint of either CA");
        }
        assert!(
            ev.verify_server_cert(&leaf(&old, "north"), &[], &name, &[], now)
                .is_err()
        );
    }

    #[test]
    fn a_bundle_without_certificates_is_refused() {
        let mut p = peer("west", "west", &[]);
        p.spec.ca_bundle = "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n".into();
        assert!(peer_entry(&p).is_err());
    }
}
