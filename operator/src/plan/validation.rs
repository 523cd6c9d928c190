//! What keeps a Transfer from starting whatever the cluster holds: spec fields this operator
//! cannot honour as asked, a Pod Security level that forbids its hostPath volumes, placement,
//! an unusable Peer. The same checks hold both for a Transfer in one cluster and for either half
//! of a cross-cluster one.

use super::*;

/// Why `t` cannot start now, if anything keeps it.
pub(super) fn blocked(t: &Transfer, obs: &Observed) -> Option<Blocked> {
    let spec = &t.spec;
    let uses_host_path = spec.source.host_path.is_some() || spec.destination.host_path.is_some();
    let psa = (obs.host_path_forbidden && uses_host_path).then(|| Blocked {
        reason: Reason::PodSecurityForbidsHostPath,
        message: "the namespace's Pod Security level (baseline or restricted) forbids hostPath volumes: use claims here, or a namespace at the privileged level".into(),
    });
    let provision = match &obs.provision {
        Some(crate::plan::provision::ProvisionStep::Blocked(b)) => Some(b.clone()),
        _ => None,
    };
    unsupported(spec, obs)
        .or(psa)
        .or(provision)
        .or_else(|| obs.placement.clone().err())
        .or_else(|| peer_blocked(obs))
}

/// The bandwidth limit in bytes per second; `Err` names what is wrong with the quantity.
pub fn bandwidth_bytes(spec: &TransferSpec) -> Result<Option<u64>, String> {
    match &spec.bandwidth_limit {
        None => Ok(None),
        Some(q) => match parse_quantity(&q.0) {
            None => Err(format!(
                "bandwidthLimit {:?} is not a quantity of bytes per second (e.g. 50M, 1Gi)",
                q.0
            )),
            // Zero would reach the mover as "no limit": the opposite of what was asked.
            Some(0) => Err(format!(
                "bandwidthLimit {:?} is under 1 byte per second; leave it unset for no limit",
                q.0
            )),
            Some(v) => Ok(Some(v)),
        },
    }
}

pub use ferry_proto::quantity::parse_quantity;

/// Spec fields this operator cannot honour as asked, refused instead of silently ignored.
pub(super) fn unsupported(spec: &TransferSpec, obs: &Observed) -> Option<Blocked> {
    if spec.read_all_files && !obs.privileged_readers_allowed {
        return Some(Blocked {
            reason: Reason::PrivilegedReadersNotAllowed,
            message: "spec.readAllFiles needs a sender with CAP_DAC_READ_SEARCH, which this \
                      operator does not start (an administrator allows it with the chart's \
                      allowPrivilegedReaders, the operator's --allow-privileged-readers)"
                .into(),
        });
    }
    if let Some(class) = &obs.priority_class_refused {
        return Some(Blocked {
            reason: Reason::PriorityClassNotAllowed,
            message: format!(
                "spec.mover.priorityClassName {class:?} is not one this operator allows (an \
                 administrator lists them with --allowed-priority-class); leave it unset for the \
                 default"
            ),
        });
    }
    if spec.preserve_ownership && !obs.root_movers_allowed {
        return Some(Blocked {
            reason: Reason::RootMoversNotAllowed,
            message: "spec.preserveOwnership needs movers running as root, which this operator \
                      does not start (an administrator allows them with the chart's \
                      allowRootMovers, the operator's --allow-root-movers)"
                .into(),
        });
    }
    let invalid = bandwidth_bytes(spec)
        .err()
        .or_else(|| {
            let rules = spec.exclude.iter().map(|p| (false, p.as_str()));
            ferry_proto::filter::Filter::new(rules)
                .err()
                .map(|e| format!("spec.exclude: {e}"))
        })
        .or_else(|| {
            let schedule = spec.schedule.as_ref()?;
            crate::plan::runs::Schedule::parse(schedule).err()
        });
    invalid.map(|message| Blocked {
        reason: Reason::InvalidSpec,
        message,
    })
}

/// A half whose Peer is missing or unusable waits with the reason.
pub(super) fn peer_blocked(obs: &Observed) -> Option<Blocked> {
    obs.remote.as_ref()?.peer.clone()?.err()
}
