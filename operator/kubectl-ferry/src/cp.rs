//! `kubectl ferry cp SOURCE DESTINATION`: the Transfer its arguments describe.
//!
//! Endpoints: `NODE:/PATH` or `node/NODE:/PATH` (a host directory on one node), `pvc/CLAIM` or
//! `pvc/CLAIM:/PATH` (a directory inside a claim of the namespace). With `--to-nodes` or
//! `--selector` the destination is a bare `/PATH`: the same directory on every node named or
//! selected (a fan-out). The API server's validation has the last word on names and paths;
//! this only refuses what cannot be read as an endpoint at all, and says how to write it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Why the arguments describe no Transfer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpError {
    #[error("{side} {arg:?}: write NODE:/PATH, node/NODE:/PATH or pvc/CLAIM[:/PATH]{fan_out}")]
    Unreadable {
        side: &'static str,
        arg: String,
        fan_out: &'static str,
    },
    #[error("{side} {arg:?}: a host path must be absolute (start with /)")]
    Relative { side: &'static str, arg: String },
    #[error("--to-nodes and --selector are two ways to name the destination nodes: give one")]
    BothNodeSets,
    #[error(
        "destination {0:?}: with --to-nodes or --selector the destination is the path on each node (/PATH)"
    )]
    FanOutNeedsPath(String),
    #[error("--to-nodes {0:?}: a comma-separated list of node names")]
    Nodes(String),
    #[error("--selector {0:?}: comma-separated KEY=VALUE labels")]
    Selector(String),
    #[error("--provision creates the destination claim: the destination is pvc/CLAIM[:/PATH]")]
    ProvisionNeedsClaim,
    #[error("--{0} goes with --{1}")]
    Needs(&'static str, &'static str),
}

/// The destination nodes of a fan-out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSet {
    Names(Vec<String>),
    Labels(BTreeMap<String, String>),
}

/// Everything `cp` puts in the Transfer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpArgs {
    pub source: String,
    pub destination: String,
    /// `--to-nodes` / `--selector`.
    pub nodes: Option<NodeSet>,
    /// `--name`; none: the API server names it `cp-` and five characters.
    pub name: Option<String>,
    pub namespace: String,
    pub bandwidth_limit: Option<String>,
    pub streams: Option<u32>,
    /// `--schedule` (a cron expression) and `--time-zone`.
    pub schedule: Option<String>,
    pub time_zone: Option<String>,
    /// `--provision` (a size or `fromSource`) and `--storage-class`.
    pub provision: Option<String>,
    pub storage_class: Option<String>,
    /// `--min-available` (a fan-out's `hostPath.minAvailable`).
    pub min_available: Option<u32>,
}

/// Reads `--to-nodes` and `--selector` (at most one of them).
pub fn node_set(
    to_nodes: Option<&str>,
    selector: Option<&str>,
) -> Result<Option<NodeSet>, CpError> {
    match (to_nodes, selector) {
        (Some(_), Some(_)) => Err(CpError::BothNodeSets),
        (Some(list), None) => {
            let names: Vec<String> = list.split(',').map(str::trim).map(str::to_owned).collect();
            if names.iter().any(String::is_empty) {
                return Err(CpError::Nodes(list.to_owned()));
            }
            Ok(Some(NodeSet::Names(names)))
        }
        (None, Some(labels)) => {
            let mut map = BTreeMap::new();
            for pair in labels.split(',') {
                match pair.split_once('=') {
                    Some((k, v)) if !k.trim().is_empty() => {
                        map.insert(k.trim().to_owned(), v.trim().to_owned());
                    }
                    _ => return Err(CpError::Selector(labels.to_owned())),
                }
            }
            Ok(Some(NodeSet::Labels(map)))
        }
        (None, None) => Ok(None),
    }
}

fn host_path(side: &'static str, arg: &str, node: &str, path: &str) -> Result<Value, CpError> {
    if !path.starts_with('/') {
        return Err(CpError::Relative {
            side,
            arg: arg.to_owned(),
        });
    }
    Ok(json!({"hostPath": {"node": node, "path": path}}))
}

/// One endpoint written as `NODE:/PATH`, `node/NODE:/PATH` or `pvc/CLAIM[:/PATH]`.
pub fn endpoint(side: &'static str, arg: &str, fan_out_hint: bool) -> Result<Value, CpError> {
    let unreadable = || CpError::Unreadable {
        side,
        arg: arg.to_owned(),
        fan_out: if fan_out_hint {
            ", or /PATH with --to-nodes or --selector"
        } else {
            ""
        },
    };
    if let Some(rest) = arg.strip_prefix("pvc/") {
        let (claim, path) = rest.split_once(':').unwrap_or((rest, ""));
        if claim.is_empty() {
            return Err(unreadable());
        }
        return Ok(json!({"pvc": {"claimName": claim, "path": path}}));
    }
    let (node, path) = match arg.strip_prefix("node/") {
        Some(rest) => rest.split_once(':').ok_or_else(unreadable)?,
        None => arg.split_once(':').ok_or_else(unreadable)?,
    };
    if node.is_empty() || node.contains('/') {
        return Err(unreadable());
    }
    host_path(side, arg, node, path)
}

/// The Transfer `args` describe, as the API server takes it.
pub fn transfer(args: &CpArgs) -> Result<Value, CpError> {
    let source = endpoint("source", &args.source, false)?;
    let destination = match &args.nodes {
        None => endpoint("destination", &args.destination, true)?,
        Some(set) => {
            if !args.destination.starts_with('/') {
                return Err(CpError::FanOutNeedsPath(args.destination.clone()));
            }
            let nodes = match set {
                NodeSet::Names(names) => json!({"nodes": names}),
                NodeSet::Labels(labels) => json!({"nodeSelector": {"matchLabels": labels}}),
            };
            let mut host = nodes;
            if let Some(m) = args.min_available {
                host["minAvailable"] = json!(m);
            }
            host["path"] = json!(args.destination);
            json!({"hostPath": host})
        }
    };
    if args.min_available.is_some() && args.nodes.is_none() {
        return Err(CpError::Needs("min-available", "to-nodes or --selector"));
    }
    let mut destination = destination;
    match (&args.provision, &args.storage_class) {
        (None, Some(_)) => return Err(CpError::Needs("storage-class", "provision")),
        (None, None) => {}
        (Some(capacity), class) => {
            let Some(pvc) = destination.get_mut("pvc") else {
                return Err(CpError::ProvisionNeedsClaim);
            };
            let mut provision = json!({"capacity": capacity});
            if let Some(class) = class {
                provision["storageClassName"] = json!(class);
            }
            pvc["provision"] = provision;
        }
    }
    let mut spec = json!({"source": source, "destination": destination});
    match (&args.schedule, &args.time_zone) {
        (None, Some(_)) => return Err(CpError::Needs("time-zone", "schedule")),
        (None, None) => {}
        (Some(cron), zone) => {
            spec["schedule"] = json!({"cron": cron});
            if let Some(zone) = zone {
                spec["schedule"]["timeZone"] = json!(zone);
            }
        }
    }
    if let Some(limit) = &args.bandwidth_limit {
        spec["bandwidthLimit"] = json!(limit);
    }
    if let Some(streams) = args.streams {
        spec["streams"] = json!(streams);
    }
    let metadata = match &args.name {
        Some(name) => json!({"name": name, "namespace": args.namespace}),
        None => json!({"generateName": "cp-", "namespace": args.namespace}),
    };
    Ok(json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "Transfer",
        "metadata": metadata,
        "spec": spec,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(source: &str, destination: &str) -> CpArgs {
        CpArgs {
            source: source.into(),
            destination: destination.into(),
            namespace: "ml".into(),
            ..CpArgs::default()
        }
    }

    #[test]
    fn every_endpoint_form_reads_as_the_crd_writes_it() {
        let t = transfer(&args("node-a:/data/x", "node/gpu-7:/scratch/imagenet")).expect("cp");
        assert_eq!(
            t["spec"],
            json!({"source": {"hostPath": {"node": "node-a", "path": "/data/x"}},
                   "destination": {"hostPath": {"node": "gpu-7", "path": "/scratch/imagenet"}}})
        );
        assert_eq!(
            t["metadata"],
            json!({"generateName": "cp-", "namespace": "ml"})
        );
        let t = transfer(&args("pvc/datasets:/imagenet", "pvc/copy")).expect("cp");
        assert_eq!(
            t["spec"],
            json!({"source": {"pvc": {"claimName": "datasets", "path": "/imagenet"}},
                   "destination": {"pvc": {"claimName": "copy", "path": ""}}})
        );
        // What it builds deserializes as a Transfer.
        let _: ferry_api::Transfer = serde_json::from_value(t).expect("a Transfer");
    }

    #[test]
    fn a_fan_out_names_its_nodes_or_labels_and_a_path() {
        let mut a = args("node-a:/data/x", "/scratch/x");
        a.nodes = node_set(Some("gpu-1, gpu-2"), None).expect("nodes");
        a.name = Some("stage".into());
        a.bandwidth_limit = Some("100Mi".into());
        a.streams = Some(8);
        let t = transfer(&a).expect("cp");
        assert_eq!(
            t["spec"]["destination"],
            json!({"hostPath": {"nodes": ["gpu-1", "gpu-2"], "path": "/scratch/x"}})
        );
        assert_eq!(t["spec"]["bandwidthLimit"], "100Mi");
        assert_eq!(t["spec"]["streams"], 8);
        assert_eq!(t["metadata"]["name"], "stage");
        a.min_available = Some(1);
        assert_eq!(
            transfer(&a).expect("cp")["spec"]["destination"]["hostPath"]["minAvailable"],
            1
        );
        a.nodes = node_set(None, Some("pool=gpu,zone=a")).expect("labels");
        assert_eq!(
            transfer(&a).expect("cp")["spec"]["destination"]["hostPath"]["nodeSelector"],
            json!({"matchLabels": {"pool": "gpu", "zone": "a"}})
        );
        let _: ferry_api::Transfer =
            serde_json::from_value(transfer(&a).expect("cp")).expect("a Transfer");
        let mut one = args("node-a:/data/x", "node-b:/scratch/x");
        one.min_available = Some(1);
        assert_eq!(
            transfer(&one).unwrap_err().to_string(),
            "--min-available goes with --to-nodes or --selector"
        );
    }

    #[test]
    fn a_schedule_and_a_provisioned_claim_compose() {
        let mut a = args("pvc/models", "pvc/models-nvme");
        a.schedule = Some("0 2 * * *".into());
        a.time_zone = Some("Europe/Berlin".into());
        a.provision = Some("fromSource".into());
        a.storage_class = Some("fast-nvme".into());
        let t = transfer(&a).expect("cp");
        assert_eq!(
            t["spec"]["schedule"],
            json!({"cron": "0 2 * * *", "timeZone": "Europe/Berlin"})
        );
        assert_eq!(
            t["spec"]["destination"]["pvc"]["provision"],
            json!({"capacity": "fromSource", "storageClassName": "fast-nvme"})
        );
        let _: ferry_api::Transfer = serde_json::from_value(t).expect("a Transfer");

        let mut host = args("node-a:/x", "node-b:/y");
        host.provision = Some("1Gi".into());
        assert_eq!(transfer(&host), Err(CpError::ProvisionNeedsClaim));
        let mut class_only = args("node-a:/x", "pvc/y");
        class_only.storage_class = Some("fast".into());
        assert_eq!(
            transfer(&class_only).expect_err("class").to_string(),
            "--storage-class goes with --provision"
        );
        let mut zone_only = args("node-a:/x", "pvc/y");
        zone_only.time_zone = Some("UTC".into());
        assert_eq!(
            transfer(&zone_only).expect_err("zone").to_string(),
            "--time-zone goes with --schedule"
        );
    }

    #[test]
    fn arguments_that_name_no_endpoint_say_how_to_write_one() {
        let err = |s: &str, d: &str| transfer(&args(s, d)).expect_err(s).to_string();
        assert_eq!(
            err("/data/x", "node-b:/y"),
            "source \"/data/x\": write NODE:/PATH, node/NODE:/PATH or pvc/CLAIM[:/PATH]"
        );
        assert_eq!(
            err("node-a:/x", "/y"),
            "destination \"/y\": write NODE:/PATH, node/NODE:/PATH or pvc/CLAIM[:/PATH], or /PATH with --to-nodes or --selector"
        );
        assert_eq!(
            err("node-a:data", "node-b:/y"),
            "source \"node-a:data\": a host path must be absolute (start with /)"
        );
        assert!(err("pvc/:/x", "node-b:/y").contains("pvc/CLAIM"));
        assert!(err("foo/bar:/x", "node-b:/y").contains("write NODE:/PATH"));
        let mut a = args("node-a:/x", "node-b:/y");
        a.nodes = node_set(Some("gpu-1"), None).expect("nodes");
        assert_eq!(
            transfer(&a).expect_err("fan-out").to_string(),
            "destination \"node-b:/y\": with --to-nodes or --selector the destination is the path on each node (/PATH)"
        );
        assert_eq!(node_set(Some("a"), Some("k=v")), Err(CpError::BothNodeSets));
        assert_eq!(
            node_set(Some("a,,b"), None),
            Err(CpError::Nodes("a,,b".into()))
        );
        assert_eq!(
            node_set(None, Some("pool")),
            Err(CpError::Selector("pool".into()))
        );
    }
}
