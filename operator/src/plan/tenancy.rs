//! Which store a receiver uses at its node's service, and what its certificate says of it
//! ([`ferry_proto::net::Tenancy`]): its namespace, its run, and whether its blocks join the
//! shared store or stay its run's.
//!
//! - With `dedup`, the receiver takes and puts blocks in its dedup domain's store.
//! - A fan-out child without `dedup` still passes blocks to its siblings (the source sends
//!   about one copy whatever the number of destinations), through a store of its run alone that
//!   no other Transfer sees and that the service removes once the run is done.
//! - Anything else uses no store.
//!
//! The run of a fan-out child is its fan-out's (the parent's uid and the run its trigger
//! names), the same for every sibling, so they may wait for each other's blocks; any other
//! Transfer's run is its own.

use ferry_proto::net::{StoreScope, Tenancy, TenancyError};
use kube::ResourceExt;

use crate::api::Transfer;
use crate::names::{self, LABEL_FAN_OUT_OF};
use crate::plan::fan_out::run_of_trigger;

/// The store a receiver uses: `dedup_planned` is the plan's word (the Transfer asked for dedup
/// and its store has not failed it).
pub fn store_scope(t: &Transfer, dedup_planned: bool) -> Option<StoreScope> {
    if dedup_planned {
        Some(StoreScope::Shared)
    } else if !t.spec.dedup && fan_out_run(t).is_some() {
        Some(StoreScope::Run)
    } else {
        None
    }
}

/// The fan-out run a child belongs to: `<fan-out uid>.<run>`.
fn fan_out_run(t: &Transfer) -> Option<String> {
    t.labels().get(LABEL_FAN_OUT_OF)?;
    let owner = t
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Transfer")?;
    let run = run_of_trigger(t.spec.trigger.as_deref()?)?;
    Some(names::transfer_id(&owner.uid, run))
}

/// What the receiver of run `run` of `t` states at its node service (`scope` from
/// [`store_scope`]; a receiver that uses no store states its run as shared, which nothing
/// reads). `node` is where the receiver will run, when placement knows it already: the service
/// of any other node then lets it take blocks but never put them.
pub fn receiver_tenancy(
    t: &Transfer,
    run: u32,
    scope: Option<StoreScope>,
    cluster: &str,
    node: Option<&str>,
) -> Result<Tenancy, TenancyError> {
    let own = || names::transfer_id(&t.uid().unwrap_or_default(), run);
    let run_key = fan_out_run(t).unwrap_or_else(own);
    let tenancy = Tenancy::new(
        cluster,
        &t.namespace().unwrap_or_default(),
        &run_key,
        scope.unwrap_or(StoreScope::Shared),
    )?;
    match node {
        Some(node) => tenancy.on_node(node),
        None => Ok(tenancy),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TransferSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn transfer(dedup: bool, child_of: Option<(&str, u32)>) -> Transfer {
        let mut spec: TransferSpec = serde_json::from_value(serde_json::json!({
            "source": {"hostPath": {"node": "a", "path": "/data/x"}},
            "destination": {"hostPath": {"node": "b", "path": "/data/y"}},
            "dedup": dedup,
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let mut meta = ObjectMeta {
            name: Some("t".into()),
            namespace: Some("ml".into()),
            uid: Some("u-1".into()),
            ..Default::default()
        };
        if let Some((parent, run)) = child_of {
            spec.trigger = Some(crate::plan::fan_out::child_trigger(run));
            meta.labels = Some([(LABEL_FAN_OUT_OF.to_owned(), "p".to_owned())].into());
            meta.owner_references = Some(vec![OwnerReference {
                api_version: "ferry.dev/v1alpha1".into(),
                kind: "Transfer".into(),
                name: "p".into(),
                uid: parent.into(),
                controller: Some(true),
                ..Default::default()
            }]);
        }
        Transfer {
            metadata: meta,
            spec,
            status: None,
        }
    }

    #[test]
    fn dedup_shares_and_a_fan_out_without_it_keeps_its_blocks_to_its_run() {
        assert_eq!(
            store_scope(&transfer(true, None), true),
            Some(StoreScope::Shared)
        );
        // Dedup turned off by a failing store: none.
        assert_eq!(store_scope(&transfer(true, None), false), None);
        assert_eq!(store_scope(&transfer(false, None), false), None);
        let child = transfer(false, Some(("parent-uid", 3)));
        assert_eq!(store_scope(&child, false), Some(StoreScope::Run));
        assert_eq!(
            store_scope(&transfer(true, Some(("parent-uid", 3))), true),
            Some(StoreScope::Shared)
        );
    }

    #[test]
    fn siblings_share_their_fan_outs_run_and_others_have_their_own() {
        let child = transfer(false, Some(("parent-uid", 3)));
        let t = receiver_tenancy(&child, 1, Some(StoreScope::Run), "east", Some("b"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            t.uri(),
            "urn:ferry:cluster:east:tenant:ml:run:parent-uid.3:store:run:node:b"
        );
        let lone = receiver_tenancy(
            &transfer(true, None),
            2,
            Some(StoreScope::Shared),
            "east",
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(lone.node, None);
        assert_eq!(
            (lone.run.as_str(), lone.namespace.as_str()),
            ("u-1.2", "ml")
        );
    }
}
