//! Throwaway PKI for one transfer (`ferry-mover certs`): a CA and one leaf per role.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::identity::{Identity, IdentityError, Role};
use super::tenancy::Tenancy;

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("a certificate must name at least one identity")]
    NoIdentity,
    #[error("failed to generate the {what} certificate")]
    Generate {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("failed to write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// PEM-encoded CA certificate and leaf certificates with their keys, per role.
pub struct GeneratedCerts {
    pub ca_cert_pem: String,
    /// (role, certificate PEM, private key PEM)
    pub leaves: Vec<(Role, String, String)>,
}

fn gen_err(what: &str) -> impl FnOnce(rcgen::Error) -> CertsError + '_ {
    move |source| CertsError::Generate {
        what: what.to_owned(),
        source,
    }
}

/// A certificate authority held in memory (its key is never written by `ferry-mover certs`).
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
    days: u32,
}

/// The parameters that name and constrain a ferry CA (the same for a fresh and a stored one).
fn ca_params(label: &str) -> Result<CertificateParams, CertsError> {
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(gen_err("CA"))?;
    ca.distinguished_name
        .push(DnType::CommonName, format!("ferry {label} CA"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(ca)
}

impl Ca {
    /// A fresh CA named after `label`, issuing leaves valid for `days`.
    pub fn new(label: &str, days: u32) -> Result<Self, CertsError> {
        Self::new_valid_for(label, days, days)
    }

    /// A fresh CA valid for `ca_days`, issuing leaves valid for `leaf_days` (an operator keeps
    /// a long-lived CA and issues short-lived leaves).
    pub fn new_valid_for(label: &str, ca_days: u32, leaf_days: u32) -> Result<Self, CertsError> {
        let ca_key = KeyPair::generate().map_err(gen_err("CA key"))?;
        let mut ca = ca_params(label)?;
        set_validity(&mut ca, ca_days);
        let cert = ca.self_signed(&ca_key).map_err(gen_err("CA"))?;
        let key_pem = ca_key.serialize_pem();
        Ok(Self {
            issuer: Issuer::new(ca, ca_key),
            cert_pem: cert.pem(),
            key_pem,
            days: leaf_days,
        })
    }

    /// A CA stored earlier ([`Ca::cert_pem`], [`Ca::key_pem`]) under the same `label`. Leaves
    /// chain to the stored certificate: issuer name and key are the same.
    pub fn from_pem(
        label: &str,
        cert_pem: &str,
        key_pem: &str,
        leaf_days: u32,
    ) -> Result<Self, CertsError> {
        let key = KeyPair::from_pem(key_pem).map_err(gen_err("stored CA key"))?;
        Ok(Self {
            issuer: Issuer::new(ca_params(label)?, key),
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            days: leaf_days,
        })
    }

    /// The CA's private key (PEM), for whoever must store the CA.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a leaf for (transfer, role): returns (certificate PEM, private key PEM).
    ///
    /// Mover leaves carry both serverAuth and clientAuth: each mover is a TLS client or server
    /// on the data port depending on its role and a server on its progress port; the role in
    /// the URI SAN (checked by every verifier) keeps a sender from acting as a receiver.
    pub fn issue(&self, transfer_id: &str, role: Role) -> Result<(String, String), CertsError> {
        self.issue_for(&Identity::new(transfer_id, role)?)
    }

    /// Issues a leaf for any identity (an operator issues scoped ones: cluster and attempt).
    pub fn issue_for(&self, id: &Identity) -> Result<(String, String), CertsError> {
        self.issue_for_all(std::slice::from_ref(id))
    }

    /// Issues one leaf speaking for every identity of `ids` (one URI SAN each, in order): a
    /// sender serving several Transfers at once, each receiver accepting it for its own. They
    /// must share the role and the issuing cluster ([`Identity::all_from_cert_der`]).
    pub fn issue_for_all(&self, ids: &[Identity]) -> Result<(String, String), CertsError> {
        self.issue_leaf(ids, None)
    }

    /// Issues a receiver's leaf for `id` that also states its `tenancy` at its node's service
    /// (a second URI SAN, which identity checks ignore).
    pub fn issue_with_tenancy(
        &self,
        id: &Identity,
        tenancy: &Tenancy,
    ) -> Result<(String, String), CertsError> {
        self.issue_leaf(std::slice::from_ref(id), Some(tenancy))
    }

    fn issue_leaf(
        &self,
        ids: &[Identity],
        tenancy: Option<&Tenancy>,
    ) -> Result<(String, String), CertsError> {
        let Some(first) = ids.first() else {
            return Err(CertsError::NoIdentity);
        };
        Identity::check_one_issuer(ids)?;
        let (transfer_id, role) = (first.transfer_id.as_str(), first.role);
        let what = format!("{role} leaf");
        let key = KeyPair::generate().map_err(gen_err(&what))?;
        let mut p = CertificateParams::new(Vec::<String>::new()).map_err(gen_err(&what))?;
        let name = match ids.len() {
            1 => format!("ferry {role} {transfer_id}"),
            n => format!("ferry {role} {transfer_id} and {} more", n - 1),
        };
        p.distinguished_name.push(DnType::CommonName, name);
        p.subject_alt_names = ids
            .iter()
            .map(Identity::uri)
            .chain(tenancy.map(Tenancy::uri))
            .map(|uri| rcgen::string::Ia5String::try_from(uri).map(SanType::URI))
            .collect::<Result<_, _>>()
            .map_err(gen_err(&what))?;
        // Operators are clients of the movers' progress ports and both client and server of
        // the cross-cluster API; every verifier checks the role in the URI SAN besides.
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        set_validity(&mut p, self.days);
        let cert = p.signed_by(&key, &self.issuer).map_err(gen_err(&what))?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// Generates a throwaway CA and sender, receiver and operator leaves for `transfer_id`.
pub fn generate_certs(transfer_id: &str, days: u32) -> Result<GeneratedCerts, CertsError> {
    generate_certs_in(transfer_id, days, None)
}

/// [`generate_certs`], or with `cluster` the certificates an operator of that cluster issues
/// (attempt 1) plus its node service's (`node.crt`): what a node service admits, so a fan-out
/// can be run by hand.
pub fn generate_certs_in(
    transfer_id: &str,
    days: u32,
    cluster: Option<&str>,
) -> Result<GeneratedCerts, CertsError> {
    // Validate up front so the error is about the id, not about certificate encoding.
    Identity::new(transfer_id, Role::Sender)?;
    let ca = Ca::new(&format!("transfer {transfer_id}"), days)?;
    let mut leaves = Vec::new();
    for role in [Role::Sender, Role::Receiver, Role::Operator] {
        let id = match cluster {
            Some(c) => Identity::scoped(transfer_id, role, c, 1)?,
            None => Identity::new(transfer_id, role)?,
        };
        let (cert, key) = ca.issue_for(&id)?;
        leaves.push((role, cert, key));
    }
    if let Some(c) = cluster {
        let (cert, key) = ca.issue_for(&Identity::node_service(c)?)?;
        leaves.push((Role::Node, cert, key));
    }
    Ok(GeneratedCerts {
        ca_cert_pem: ca.cert_pem.clone(),
        leaves,
    })
}

/// Valid from an hour ago (clock skew between nodes) for `days` days.
fn set_validity(p: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::hours(1);
    p.not_after = now + time::Duration::days(i64::from(days.max(1)));
}

/// Writes `ca.crt`, `<role>.crt` and `<role>.key` for every role into `dir` (created if missing);
/// keys are written with mode 0600.
pub fn write_certs(dir: &Path, certs: &GeneratedCerts) -> Result<Vec<PathBuf>, CertsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    std::fs::create_dir_all(dir).map_err(|source| CertsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let mut written = Vec::new();
    let mut put = |name: String, body: &str, mode: u32| -> Result<(), CertsError> {
        let path = dir.join(name);
        let res = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&path)
            .and_then(|mut f| f.write_all(body.as_bytes()));
        res.map_err(|source| CertsError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
        Ok(())
    };
    put("ca.crt".into(), &certs.ca_cert_pem, 0o644)?;
    for (role, cert, key) in &certs.leaves {
        put(format!("{role}.crt"), cert, 0o644)?;
        put(format!("{role}.key"), key, 0o600)?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, KeyPair, SanType};

    use super::*;

    fn self_signed(uris: &[String]) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(rcgen::string::Ia5String::try_from(u.clone()).unwrap()))
            .collect();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_certificate_naming_two_roles_or_clusters_carries_no_identity() {
        let a = |role, cluster| Identity::scoped("a.1", role, cluster, 1).unwrap().uri();
        let good = self_signed(&[
            a(Role::Sender, "east"),
            Identity::scoped("b.1", Role::Sender, "east", 4)
                .unwrap()
                .uri(),
        ]);
        let ids = Identity::all_from_cert_der(&good).unwrap();
        assert_eq!(ids.len(), 2);
        assert_eq!(Identity::from_cert_der(&good).unwrap(), ids[0]);
        // Not made by `issue_for_all`, which refuses them: whoever made these, a verifier
        // reading one must not take its second name.
        for uris in [
            [a(Role::Sender, "east"), a(Role::Receiver, "east")],
            [a(Role::Sender, "east"), a(Role::Sender, "west")],
        ] {
            let der = self_signed(&uris);
            assert!(matches!(
                Identity::all_from_cert_der(&der),
                Err(IdentityError::Mixed { .. })
            ));
            assert!(Identity::from_cert_der(&der).is_err());
        }
    }
}
