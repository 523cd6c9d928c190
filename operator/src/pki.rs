//! The operator's certificate authority and the short-lived certificates it issues.
//!
//! The CA lives in a Secret in the operator's namespace (created on first start, reused after a
//! restart or by another replica). Every attempt of a Transfer gets its own sender and receiver
//! certificates, bound to the run's transfer id; the operator holds a third, in memory, for
//! reading the movers' progress. The certificate and identity code is the mover's
//! (`ferry_proto::net`), so both ends agree on one format.

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_proto::net::{Ca, CertsError, Identity, Role, Tenancy, TlsFiles};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Name of the Secret holding the operator's CA.
pub const CA_SECRET: &str = "ferry-ca";
/// Annotation of the CA Secret naming the cluster the CA was created for.
const CLUSTER_ANNOTATION: &str = "ferry.dev/cluster-name";
/// Days the CA is valid; it is replaced by deleting the Secret and restarting the operator.
const CA_DAYS: u32 = 3650;

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("failed to read or create the CA Secret {namespace}/{CA_SECRET}")]
    Api {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("the CA Secret {0} lacks tls.crt or tls.key")]
    Incomplete(String),
    #[error(transparent)]
    Certs(#[from] CertsError),
    #[error("failed to build TLS settings: {0}")]
    Tls(String),
}

/// The CA, as loaded or created.
pub struct Authority {
    ca: Ca,
    cluster: String,
}

fn label(cluster: &str) -> String {
    format!("cluster {cluster}")
}

impl Authority {
    /// Loads the CA from its Secret, creating both if missing (a concurrent creator wins and is
    /// read back).
    pub async fn load_or_create(
        client: kube::Client,
        namespace: &str,
        cluster: &str,
        leaf_days: u32,
    ) -> Result<Authority, PkiError> {
        let api: Api<Secret> = Api::namespaced(client, namespace);
        let api_err = |source| PkiError::Api {
            namespace: namespace.to_owned(),
            source,
        };
        if let Some(s) = api.get_opt(CA_SECRET).await.map_err(api_err)? {
            return Self::from_secret(&s, cluster, leaf_days);
        }
        let mut annotations = BTreeMap::new();
        annotations.insert(CLUSTER_ANNOTATION.to_owned(), cluster.to_owned());
        let ca = Ca::new_valid_for(&label(cluster), CA_DAYS, leaf_days)?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(CA_SECRET.into()),
                namespace: Some(namespace.into()),
                labels: Some(BTreeMap::from([(
                    crate::names::LABEL_MANAGED_BY.to_owned(),
                    crate::names::MANAGER.to_owned(),
                )])),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                (
                    "tls.crt".to_owned(),
                    ByteString(ca.cert_pem().as_bytes().to_vec()),
                ),
                (
                    "tls.key".to_owned(),
                    ByteString(ca.key_pem().as_bytes().to_vec()),
                ),
            ])),
            ..Secret::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(Authority {
                ca,
                cluster: cluster.to_owned(),
            }),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let s = api.get(CA_SECRET).await.map_err(api_err)?;
                Self::from_secret(&s, cluster, leaf_days)
            }
            Err(e) => Err(api_err(e)),
        }
    }

    /// The CA's name includes the cluster it was created for; a later `--cluster-name` must not
    /// rename it (leaves would no longer chain to the stored certificate), so the stored name wins.
    fn from_secret(s: &Secret, cluster: &str, leaf_days: u32) -> Result<Authority, PkiError> {
        let stored = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CLUSTER_ANNOTATION))
            .cloned();
        let cluster = match stored {
            Some(c) if c != cluster => {
                tracing::warn!(
                    stored = %c, flag = %cluster,
                    "the CA was created for another cluster name; keeping the stored one"
                );
                c
            }
            Some(c) => c,
            None => cluster.to_owned(),
        };
        let cluster = cluster.as_str();
        let get = |k: &str| {
            s.data
                .as_ref()
                .and_then(|d| d.get(k))
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .ok_or_else(|| PkiError::Incomplete(CA_SECRET.into()))
        };
        let ca = Ca::from_pem(
            &label(cluster),
            &get("tls.crt")?,
            &get("tls.key")?,
            leaf_days,
        )?;
        Ok(Authority {
            ca,
            cluster: cluster.to_owned(),
        })
    }

    /// A CA generated in memory (tests).
    pub fn ephemeral(cluster: &str) -> Result<Authority, PkiError> {
        Ok(Authority {
            ca: Ca::new_valid_for(&label(cluster), 1, 1)?,
            cluster: cluster.to_owned(),
        })
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The identity `role` has in `attempt` of the run `transfer_id`: scoped to this cluster and
    /// the attempt, so a certificate of an earlier attempt is refused by the movers.
    pub fn identity(
        &self,
        transfer_id: &str,
        role: Role,
        attempt: u32,
    ) -> Result<Identity, PkiError> {
        Identity::scoped(transfer_id, role, &self.cluster, attempt)
            .map_err(|e| PkiError::Certs(CertsError::Identity(e)))
    }

    /// The Secret data of one attempt: `ca.crt`, `sender.{crt,key}`, `receiver.{crt,key}`; the
    /// receiver's certificate also states its `tenancy` at its node's service.
    pub fn attempt_files(
        &self,
        transfer_id: &str,
        attempt: u32,
        tenancy: &Tenancy,
    ) -> Result<BTreeMap<String, String>, PkiError> {
        let mut files = BTreeMap::new();
        files.insert("ca.crt".to_owned(), self.ca.cert_pem().to_owned());
        for role in [Role::Sender, Role::Receiver] {
            let id = self.identity(transfer_id, role, attempt)?;
            let (cert, key) = match role {
                Role::Receiver => self.ca.issue_with_tenancy(&id, tenancy)?,
                _ => self.ca.issue_for(&id)?,
            };
            files.insert(format!("{role}.crt"), cert);
            files.insert(format!("{role}.key"), key);
        }
        Ok(files)
    }

    /// The Secret data of a fan-out's sender: `ca.crt` and one sender certificate naming the
    /// first attempt of every child it serves (`sender.{crt,key}`), so that each child's
    /// receiver accepts it for that child alone.
    pub fn fan_out_sender_files(
        &self,
        transfer_ids: &[&str],
    ) -> Result<BTreeMap<String, String>, PkiError> {
        let ids = transfer_ids
            .iter()
            .map(|t| self.identity(t, Role::Sender, 1))
            .collect::<Result<Vec<_>, _>>()?;
        let (cert, key) = self.ca.issue_for_all(&ids)?;
        Ok(BTreeMap::from([
            ("ca.crt".to_owned(), self.ca.cert_pem().to_owned()),
            ("sender.crt".to_owned(), cert),
            ("sender.key".to_owned(), key),
        ]))
    }

    /// The Secret data of a cross-cluster half's attempt: `ca.crt` and the certificate of the
    /// one mover that runs here, naming `peer_cluster`. The transfer id was chosen by the other
    /// cluster; naming the peer keeps a certificate issued for it from matching a local
    /// Transfer's movers.
    pub fn cross_cluster_files(
        &self,
        transfer_id: &str,
        attempt: u32,
        role: Role,
        peer_cluster: &str,
        tenancy: &Tenancy,
    ) -> Result<BTreeMap<String, String>, PkiError> {
        let mut files = BTreeMap::new();
        files.insert("ca.crt".to_owned(), self.ca.cert_pem().to_owned());
        let identity =
            Identity::scoped_for_peer(transfer_id, role, &self.cluster, attempt, peer_cluster)
                .map_err(|e| PkiError::Certs(CertsError::Identity(e)))?;
        {
            let (cert, key) = match role {
                Role::Receiver => self.ca.issue_with_tenancy(&identity, tenancy)?,
                _ => self.ca.issue_for(&identity)?,
            };
            files.insert(format!("{role}.crt"), cert);
            files.insert(format!("{role}.key"), key);
        }
        Ok(files)
    }

    /// The node services' Secret data: `ca.crt`, `tls.crt`, `tls.key` (role `node`; one
    /// certificate for every node: a receiver reaches only its own node's service).
    pub fn node_service_files(&self) -> Result<BTreeMap<String, String>, PkiError> {
        let identity = Identity::node_service(&self.cluster)
            .map_err(|e| PkiError::Certs(CertsError::Identity(e)))?;
        let (cert, key) = self.ca.issue_for(&identity)?;
        Ok(BTreeMap::from([
            ("ca.crt".to_owned(), self.ca.cert_pem().to_owned()),
            ("tls.crt".to_owned(), cert),
            ("tls.key".to_owned(), key),
        ]))
    }

    /// This operator's certificate and key on the cross-cluster API (client and server).
    pub fn peering_cert(
        &self,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), PkiError> {
        let identity = crate::peering::trust::peering_identity(&self.cluster)
            .map_err(|e| PkiError::Certs(CertsError::Identity(e)))?;
        let (cert, key) = self.ca.issue_for(&identity)?;
        let tls = |e: &dyn std::fmt::Display| PkiError::Tls(e.to_string());
        let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls(&e))?;
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| tls(&e))?;
        Ok((chain, key))
    }

    /// The CA certificate (PEM): what another cluster's Peer carries as its caBundle.
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// Client TLS settings for reading the progress of the movers of one attempt.
    pub fn progress_client(
        &self,
        transfer_id: &str,
        attempt: u32,
    ) -> Result<Arc<rustls::ClientConfig>, PkiError> {
        let identity = self.identity(transfer_id, Role::Operator, attempt)?;
        let (cert, key) = self.ca.issue_for(&identity)?;
        let tls = |e: &dyn std::fmt::Display| PkiError::Tls(e.to_string());
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.ca.cert_pem().as_bytes()) {
            roots.add(c.map_err(|e| tls(&e))?).map_err(|e| tls(&e))?;
        }
        let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls(&e))?;
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| tls(&e))?;
        let files = TlsFiles {
            roots: Arc::new(roots),
            chain,
            key: Arc::new(key),
            identity,
            also: Vec::new(),
            peer: None,
        };
        let cfg = ferry_proto::net::client_config(&files, &[Role::Sender, Role::Receiver])
            .map_err(|e| tls(&e))?;
        Ok(Arc::new(cfg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_ca_issues_leaves_that_chain_to_it() {
        let a = Authority::ephemeral("test").expect("ca");
        let stored =
            Ca::from_pem(&label("test"), a.ca.cert_pem(), a.ca.key_pem(), 1).expect("load");
        let (cert, _) = stored.issue("uid.1", Role::Sender).expect("issue");
        // The mover's own loader checks the chain and the identity.
        let dir = tempfile::tempdir().expect("tmp");
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("ca.crt"), a.ca.cert_pem()).expect("write");
        std::fs::write(p("s.crt"), &cert).expect("write");
        let tenancy = Tenancy::new("east", "ml", "uid.1", ferry_proto::net::StoreScope::Shared)
            .expect("tenancy");
        let files = a.attempt_files("uid.1", 3, &tenancy).expect("files");
        // The receiver's certificate states its tenancy beside its identity.
        let der =
            rustls::pki_types::CertificateDer::pem_slice_iter(files["receiver.crt"].as_bytes())
                .next()
                .expect("one certificate")
                .expect("pem");
        assert_eq!(Tenancy::from_cert_der(&der), Some(tenancy));
        assert!(
            ferry_proto::net::Identity::scoped("uid.1", Role::Receiver, "test", 3)
                .expect("id")
                .uri()
                .contains(":attempt:3:")
        );
        assert_eq!(files.len(), 5);
        std::fs::write(p("r.crt"), &files["receiver.crt"]).expect("write");
        std::fs::write(p("r.key"), &files["receiver.key"]).expect("write");
        ferry_proto::net::load_files(
            &p("ca.crt"),
            &p("r.crt"),
            &p("r.key"),
            "uid.1",
            Role::Receiver,
        )
        .expect("receiver files load");
        assert!(
            ferry_proto::net::load_files(
                &p("ca.crt"),
                &p("r.crt"),
                &p("r.key"),
                "uid.2",
                Role::Receiver
            )
            .is_err(),
            "a certificate of another run is refused"
        );
        a.progress_client("uid.1", 3).expect("progress tls");
    }

    /// The identities of the one sender certificate in a Secret's `files`.
    fn sender_identities(files: &BTreeMap<String, String>) -> Vec<Identity> {
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            ["ca.crt", "sender.crt", "sender.key"]
        );
        let der = rustls::pki_types::CertificateDer::pem_slice_iter(files["sender.crt"].as_bytes())
            .next()
            .expect("one certificate")
            .expect("pem");
        Identity::all_from_cert_der(&der).expect("identities")
    }

    #[test]
    fn cross_cluster_certificates_name_the_peer_cluster() {
        let a = Authority::ephemeral("east").expect("ca");
        let tenancy = Tenancy::new("east", "ml", "uid.1", ferry_proto::net::StoreScope::Shared)
            .expect("tenancy");
        let files = a
            .cross_cluster_files("uid.1", 2, Role::Sender, "west", &tenancy)
            .expect("files");
        let [id] = &sender_identities(&files)[..] else {
            panic!("one identity");
        };
        assert_eq!(
            id.uri(),
            "urn:ferry:cluster:east:peer:west:transfer:uid.1:attempt:2:role:sender"
        );
    }

    #[test]
    fn a_fan_outs_sender_certificate_names_each_childs_first_attempt() {
        let a = Authority::ephemeral("east").expect("ca");
        let files = a.fan_out_sender_files(&["c1.1", "c2.4"]).expect("files");
        let ids: Vec<String> = sender_identities(&files)
            .iter()
            .map(Identity::uri)
            .collect();
        assert_eq!(
            ids,
            [
                "urn:ferry:cluster:east:transfer:c1.1:attempt:1:role:sender",
                "urn:ferry:cluster:east:transfer:c2.4:attempt:1:role:sender"
            ]
        );
    }
}
