//! Who a certificate speaks for: a transfer id and a role, carried as a URI SAN
//! `urn:ferry:transfer:<transfer-id>:role:<role>`; certificates an operator issues also name the
//! issuing cluster and the attempt:
//! `urn:ferry:cluster:<cluster>:transfer:<transfer-id>:attempt:<n>:role:<role>`. A mover of a
//! cross-cluster Transfer also names the cluster at the other end:
//! `urn:ferry:cluster:<cluster>:peer:<other>:transfer:...`.
//!
//! Two endpoints of one cluster accept each other only when everything but the role is equal, so
//! a certificate of an earlier attempt, of another Transfer or minted for another cluster is
//! refused. Across clusters each side must name the other as its peer: the transfer id of a
//! cross-cluster Transfer is chosen by the other cluster, so without the peer a certificate issued
//! for it could match a local Transfer's id and be accepted by that Transfer's local receiver.

use std::fmt;

use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

const PREFIX: &str = "urn:ferry:transfer:";
const SCOPED_PREFIX: &str = "urn:ferry:cluster:";
const PEER_SEP: &str = ":peer:";
const TRANSFER_SEP: &str = ":transfer:";
const ATTEMPT_SEP: &str = ":attempt:";
const ROLE_SEP: &str = ":role:";

/// The transfer id in the node services' certificate.
pub const NODE_SERVICE_ID: &str = "ferry-node";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Sender,
    Receiver,
    Operator,
    /// A node service: serves its node's block store to the receivers there.
    Node,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sender => "sender",
            Self::Receiver => "receiver",
            Self::Operator => "operator",
            Self::Node => "node",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sender" => Some(Self::Sender),
            "receiver" => Some(Self::Receiver),
            "operator" => Some(Self::Operator),
            "node" => Some(Self::Node),
            _ => None,
        }
    }

    /// The mover role at the other end of a data connection.
    pub fn opposite(self) -> Self {
        match self {
            Self::Sender => Self::Receiver,
            Self::Receiver | Self::Operator | Self::Node => Self::Sender,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A (transfer id, role) pair, optionally scoped to a cluster and an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub transfer_id: String,
    pub role: Role,
    /// Set in operator-issued certificates; `None` for `ferry-mover certs`.
    pub scope: Option<Scope>,
}

/// The cluster whose operator issued a certificate, the attempt it is for and, for a
/// cross-cluster Transfer, the cluster of the other mover.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub cluster: String,
    pub attempt: u32,
    pub peer: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("invalid transfer id {0:?}: use 1 to 128 characters from A-Z a-z 0-9 '.' '_' '-'")]
    BadTransferId(String),
    #[error("invalid cluster name {0:?}: use 1 to 128 characters from A-Z a-z 0-9 '.' '_' '-'")]
    BadCluster(String),
    #[error("peer certificate is not valid X.509")]
    BadCertificate,
    #[error("peer certificate carries no ferry identity (no URI SAN starting with {PREFIX})")]
    NoIdentity,
    #[error(
        "certificate names identities of different roles or clusters ({first} and {other}); \
         one certificate speaks for one role of one cluster"
    )]
    Mixed { first: String, other: String },
    #[error(
        "peer certificate identity {peer} is not allowed here: this endpoint is {local} and \
         accepts only {accepted}"
    )]
    Mismatch {
        peer: String,
        local: String,
        accepted: String,
    },
}

impl Identity {
    pub fn new(transfer_id: &str, role: Role) -> Result<Self, IdentityError> {
        validate_transfer_id(transfer_id)?;
        Ok(Self {
            transfer_id: transfer_id.to_owned(),
            role,
            scope: None,
        })
    }

    /// An identity issued by `cluster`'s operator for one attempt.
    pub fn scoped(
        transfer_id: &str,
        role: Role,
        cluster: &str,
        attempt: u32,
    ) -> Result<Self, IdentityError> {
        validate_transfer_id(cluster).map_err(|_| IdentityError::BadCluster(cluster.to_owned()))?;
        let mut id = Self::new(transfer_id, role)?;
        id.scope = Some(Scope {
            cluster: cluster.to_owned(),
            attempt,
            peer: None,
        });
        Ok(id)
    }

    /// The identity of a mover of a cross-cluster Transfer: issued by `cluster`, for a session
    /// with a mover of `peer`.
    pub fn scoped_for_peer(
        transfer_id: &str,
        role: Role,
        cluster: &str,
        attempt: u32,
        peer: &str,
    ) -> Result<Self, IdentityError> {
        validate_transfer_id(peer).map_err(|_| IdentityError::BadCluster(peer.to_owned()))?;
        let mut id = Self::scoped(transfer_id, role, cluster, attempt)?;
        if let Some(s) = id.scope.as_mut() {
            s.peer = Some(peer.to_owned());
        }
        Ok(id)
    }

    /// The identity of `cluster`'s node services (one for all nodes: a receiver reaches only its
    /// own node's service, so the node needs no name of its own). [`NODE_SERVICE_ID`] cannot be a
    /// Transfer's id (those start with the Transfer's UID), and only a node service is issued the
    /// role `node`.
    pub fn node_service(cluster: &str) -> Result<Self, IdentityError> {
        Self::scoped(NODE_SERVICE_ID, Role::Node, cluster, 0)
    }

    /// Checks the identity of a node service's client: a receiver whose certificate this
    /// cluster's operator issued (any Transfer, any attempt, a cross-cluster one too), or this
    /// cluster's operator itself (it reads the store's figures, and nothing else).
    pub fn check_node_client_of(peer: &Identity, cluster: &str) -> Result<(), IdentityError> {
        match &peer.scope {
            Some(s) if s.cluster == cluster && peer.role == Role::Receiver => Ok(()),
            Some(s) if s.cluster == cluster && s.peer.is_none() && peer.role == Role::Operator => {
                Ok(())
            }
            _ => Err(IdentityError::Mismatch {
                peer: peer.uri(),
                local: format!("the node service of cluster {cluster}"),
                accepted: format!("a receiver or operator certificate issued by cluster {cluster}"),
            }),
        }
    }

    /// The same identity with another role (what this endpoint expects of its peer).
    pub fn with_role(&self, role: Role) -> Identity {
        Identity {
            role,
            ..self.clone()
        }
    }

    pub fn uri(&self) -> String {
        match &self.scope {
            None => format!("{PREFIX}{}{ROLE_SEP}{}", self.transfer_id, self.role),
            Some(s) => {
                let peer = s
                    .peer
                    .as_ref()
                    .map(|p| format!("{PEER_SEP}{p}"))
                    .unwrap_or_default();
                format!(
                    "{SCOPED_PREFIX}{}{peer}{TRANSFER_SEP}{}{ATTEMPT_SEP}{}{ROLE_SEP}{}",
                    s.cluster, self.transfer_id, s.attempt, self.role
                )
            }
        }
    }

    pub fn parse_uri(uri: &str) -> Option<Self> {
        if let Some(rest) = uri.strip_prefix(SCOPED_PREFIX) {
            let (cluster, rest) = rest.split_once(TRANSFER_SEP)?;
            let (rest, role) = rest.rsplit_once(ROLE_SEP)?;
            let (id, attempt) = rest.rsplit_once(ATTEMPT_SEP)?;
            let (role, attempt) = (Role::parse(role)?, attempt.parse().ok()?);
            return match cluster.split_once(PEER_SEP) {
                Some((cluster, peer)) => Self::scoped_for_peer(id, role, cluster, attempt, peer),
                None => Self::scoped(id, role, cluster, attempt),
            }
            .ok();
        }
        let rest = uri.strip_prefix(PREFIX)?;
        let (id, role) = rest.rsplit_once(ROLE_SEP)?;
        Self::new(id, Role::parse(role)?).ok()
    }

    /// Reads the ferry identity from a DER certificate (the first ferry URI SAN; see
    /// [`Identity::all_from_cert_der`] for a certificate that speaks for several).
    pub fn from_cert_der(der: &[u8]) -> Result<Self, IdentityError> {
        let mut all = Self::all_from_cert_der(der)?;
        Ok(all.swap_remove(0))
    }

    /// Every ferry identity a DER certificate speaks for, in SAN order (at least one). An
    /// operator issues a sender that serves several Transfers at once one certificate naming each
    /// of them. All must have the same role and be issued by the same cluster for the same
    /// peer: the verifiers pick the CA that must have signed a certificate by the cluster it
    /// names, so a certificate naming two clusters is refused, never matched by its second name.
    pub fn all_from_cert_der(der: &[u8]) -> Result<Vec<Self>, IdentityError> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|_| IdentityError::BadCertificate)?;
        let san = cert
            .subject_alternative_name()
            .map_err(|_| IdentityError::BadCertificate)?
            .ok_or(IdentityError::NoIdentity)?;
        let all: Vec<Self> = san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                GeneralName::URI(u) => Self::parse_uri(u),
                _ => None,
            })
            .collect();
        if all.is_empty() {
            return Err(IdentityError::NoIdentity);
        }
        Self::check_one_issuer(&all)?;
        Ok(all)
    }

    /// Checks that identities may share one certificate: one role, one issuing cluster and one
    /// peer cluster.
    pub fn check_one_issuer(ids: &[Identity]) -> Result<(), IdentityError> {
        fn issuer(i: &Identity) -> (Role, Option<(&String, &Option<String>)>) {
            (i.role, i.scope.as_ref().map(|s| (&s.cluster, &s.peer)))
        }
        let Some(first) = ids.first() else {
            return Ok(());
        };
        match ids.iter().find(|i| issuer(i) != issuer(first)) {
            Some(odd) => Err(IdentityError::Mixed {
                first: first.uri(),
                other: odd.uri(),
            }),
            None => Ok(()),
        }
    }

    /// Checks a peer's identity against what `local` accepts: the same cluster, attempt and
    /// peer cluster (none for a Transfer inside one cluster). The operator reading progress
    /// names no peer cluster: it is always this cluster's own.
    pub fn check_peer(&self, peer: &Identity, accepted: &[Role]) -> Result<(), IdentityError> {
        let scope = match (&self.scope, self.role, peer.role) {
            (Some(s), _, Role::Operator) => Some(Scope {
                peer: None,
                ..s.clone()
            }),
            // The operator reads the progress of its cluster's movers, cross-cluster ones too.
            (Some(s), Role::Operator, _) => Some(Scope {
                peer: peer.scope.as_ref().and_then(|p| p.peer.clone()),
                ..s.clone()
            }),
            _ => self.scope.clone(),
        };
        self.check_peer_scoped(peer, accepted, scope)
    }

    /// Checks the identity of a peer issued by another cluster's operator for the same transfer
    /// and attempt (a cross-cluster transfer: the two operators agreed on the transfer id). Each
    /// certificate must name the other's cluster as its peer.
    pub fn check_peer_from(
        &self,
        peer: &Identity,
        accepted: &[Role],
        cluster: &str,
    ) -> Result<(), IdentityError> {
        let scope = self.scope.as_ref().and_then(|s| {
            (s.peer.as_deref() == Some(cluster)).then(|| Scope {
                cluster: cluster.to_owned(),
                attempt: s.attempt,
                peer: Some(s.cluster.clone()),
            })
        });
        match scope {
            Some(scope) => self.check_peer_scoped(peer, accepted, Some(scope)),
            // This endpoint's own certificate was not issued for a session with `cluster`.
            None => Err(IdentityError::Mismatch {
                peer: peer.uri(),
                local: self.uri(),
                accepted: format!(
                    "nothing from cluster {cluster}: this endpoint's certificate does not name it as its peer"
                ),
            }),
        }
    }

    fn check_peer_scoped(
        &self,
        peer: &Identity,
        accepted: &[Role],
        scope: Option<Scope>,
    ) -> Result<(), IdentityError> {
        if peer.transfer_id == self.transfer_id
            && peer.scope == scope
            && accepted.contains(&peer.role)
        {
            return Ok(());
        }
        let expected = Identity {
            scope,
            ..self.clone()
        };
        let accepted = accepted
            .iter()
            .map(|r| expected.with_role(*r).uri())
            .collect::<Vec<_>>()
            .join(" or ");
        Err(IdentityError::Mismatch {
            peer: peer.uri(),
            local: self.uri(),
            accepted,
        })
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri())
    }
}

fn validate_transfer_id(id: &str) -> Result<(), IdentityError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(IdentityError::BadTransferId(id.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_round_trips() {
        let id = Identity::new("abc-123", Role::Receiver).unwrap();
        assert_eq!(id.uri(), "urn:ferry:transfer:abc-123:role:receiver");
        assert_eq!(Identity::parse_uri(&id.uri()), Some(id));
    }

    #[test]
    fn bad_ids_and_roles_are_refused() {
        assert!(Identity::new("a:b", Role::Sender).is_err());
        assert!(Identity::new("", Role::Sender).is_err());
        assert!(Identity::parse_uri("urn:ferry:transfer:x:role:admin").is_none());
        assert!(Identity::parse_uri("urn:other:x").is_none());
    }

    #[test]
    fn a_peer_cluster_identity_must_name_that_cluster_and_the_same_attempt() {
        let local = Identity::scoped_for_peer("u.1", Role::Receiver, "east", 2, "west").unwrap();
        let west = Identity::scoped_for_peer("u.1", Role::Sender, "west", 2, "east").unwrap();
        assert_eq!(
            west.uri(),
            "urn:ferry:cluster:west:peer:east:transfer:u.1:attempt:2:role:sender"
        );
        assert_eq!(Identity::parse_uri(&west.uri()), Some(west.clone()));
        local
            .check_peer_from(&west, &[Role::Sender], "west")
            .unwrap();
        // Not as a local identity, not for another peer, attempt or transfer.
        assert!(local.check_peer(&west, &[Role::Sender]).is_err());
        assert!(
            local
                .check_peer_from(&west, &[Role::Sender], "north")
                .is_err()
        );
        let old = Identity::scoped_for_peer("u.1", Role::Sender, "west", 1, "east").unwrap();
        let e = local
            .check_peer_from(&old, &[Role::Sender], "west")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("urn:ferry:cluster:west:peer:east:transfer:u.1:attempt:2:role:sender"),
            "{e}"
        );
        let other = Identity::scoped_for_peer("u.2", Role::Sender, "west", 2, "east").unwrap();
        assert!(
            local
                .check_peer_from(&other, &[Role::Sender], "west")
                .is_err()
        );
        // A west certificate minted for a session with a third cluster is no good here.
        let for_north = Identity::scoped_for_peer("u.1", Role::Sender, "west", 2, "north").unwrap();
        assert!(
            local
                .check_peer_from(&for_north, &[Role::Sender], "west")
                .is_err()
        );
        // An unscoped endpoint has no attempt to pin and accepts no cluster's identities.
        let plain = Identity::new("u.1", Role::Receiver).unwrap();
        assert!(
            plain
                .check_peer_from(&west, &[Role::Sender], "west")
                .is_err()
        );
    }

    #[test]
    fn a_cross_cluster_certificate_is_refused_by_a_local_endpoint_of_the_same_id() {
        // The other cluster chose the transfer id of a local Transfer for its half: the sender
        // certificate this cluster issues for it names the peer, so the local receiver of that
        // id refuses it, and a cross-cluster receiver refuses a local sender of the same id.
        let local_receiver = Identity::scoped("u.1", Role::Receiver, "east", 2).unwrap();
        let cross_sender =
            Identity::scoped_for_peer("u.1", Role::Sender, "east", 2, "west").unwrap();
        let e = local_receiver
            .check_peer(&cross_sender, &[Role::Sender])
            .unwrap_err()
            .to_string();
        assert!(e.contains(":peer:west:"), "{e}");
        let cross_receiver =
            Identity::scoped_for_peer("u.1", Role::Receiver, "east", 2, "west").unwrap();
        let local_sender = Identity::scoped("u.1", Role::Sender, "east", 2).unwrap();
        assert!(
            cross_receiver
                .check_peer(&local_sender, &[Role::Sender])
                .is_err()
        );
        assert!(
            cross_receiver
                .check_peer_from(&local_sender, &[Role::Sender], "east")
                .is_err()
        );
        // The local operator still reads a cross-cluster mover's progress.
        let operator = Identity::scoped("u.1", Role::Operator, "east", 2).unwrap();
        cross_receiver
            .check_peer(&operator, &[Role::Operator])
            .unwrap();
        operator
            .check_peer(&cross_receiver, &[Role::Receiver])
            .unwrap();
        let foreign_operator = Identity::scoped("u.1", Role::Operator, "west", 2).unwrap();
        assert!(
            cross_receiver
                .check_peer(&foreign_operator, &[Role::Operator])
                .is_err()
        );
    }

    #[test]
    fn scoped_identities_pin_cluster_and_attempt() {
        let local = Identity::scoped("u.1", Role::Receiver, "east", 2).unwrap();
        assert_eq!(
            local.uri(),
            "urn:ferry:cluster:east:transfer:u.1:attempt:2:role:receiver"
        );
        assert_eq!(Identity::parse_uri(&local.uri()), Some(local.clone()));
        let same = local.with_role(Role::Sender);
        local.check_peer(&same, &[Role::Sender]).unwrap();
        let earlier = Identity::scoped("u.1", Role::Sender, "east", 1).unwrap();
        assert!(
            local.check_peer(&earlier, &[Role::Sender]).is_err(),
            "earlier attempt"
        );
        let foreign = Identity::scoped("u.1", Role::Sender, "west", 2).unwrap();
        assert!(
            local.check_peer(&foreign, &[Role::Sender]).is_err(),
            "other cluster"
        );
        let unscoped = Identity::new("u.1", Role::Sender).unwrap();
        assert!(
            local.check_peer(&unscoped, &[Role::Sender]).is_err(),
            "unscoped"
        );
        assert!(Identity::scoped("u.1", Role::Sender, "a:b", 1).is_err());
    }

    #[test]
    fn mismatch_names_both_identities() {
        let local = Identity::new("t1", Role::Receiver).unwrap();
        let peer = Identity::new("t2", Role::Sender).unwrap();
        let err = local
            .check_peer(&peer, &[Role::Sender])
            .unwrap_err()
            .to_string();
        assert!(err.contains("urn:ferry:transfer:t2:role:sender"), "{err}");
        assert!(err.contains("urn:ferry:transfer:t1:role:receiver"), "{err}");
        let same = Identity::new("t1", Role::Sender).unwrap();
        local.check_peer(&same, &[Role::Sender]).unwrap();
        assert!(local.check_peer(&same, &[Role::Operator]).is_err());
    }
}
