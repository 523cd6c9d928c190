//! A container's environment: `envFrom`, `env` with `$(VAR)` expansion and `valueFrom` (secretKeyRef,
//! configMapKeyRef, fieldRef), plus what the kubelet always sets (KUBERNETES_SERVICE_HOST/PORT,
//! HOSTNAME, PATH).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVarSource, Pod, Secret};
use kube::{Api, Client};

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error(
        "failed to read {kind} {namespace}/{name} for the environment of container {container}"
    )]
    Fetch {
        kind: &'static str,
        namespace: String,
        name: String,
        container: String,
        #[source]
        source: kube::Error,
    },
    #[error("key {key} not found in {kind} {name} (container {container}, variable {var})")]
    MissingKey {
        kind: &'static str,
        name: String,
        key: String,
        container: String,
        var: String,
    },
    #[error("{kind} {name} named by envFrom of container {container} does not exist")]
    MissingObject {
        kind: &'static str,
        name: String,
        container: String,
    },
    #[error("unsupported valueFrom for variable {var} of container {container}: {what}")]
    Unsupported {
        var: String,
        container: String,
        what: String,
    },
}

/// Facts about the running pod the downward API can expose.
#[derive(Debug, Clone)]
pub struct PodFacts {
    pub pod_ip: String,
    pub host_ip: String,
    pub node_name: String,
}

/// The value of a downward-API `fieldPath` for `pod`, or None if the path is not supported.
pub fn field_value(pod: &Pod, facts: &PodFacts, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let map_entry = |map: &Option<BTreeMap<String, String>>, prefix: &str| -> Option<String> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(
            map.as_ref()
                .and_then(|m| m.get(key).cloned())
                .unwrap_or_default(),
        )
    };
    let render_map = |map: &Option<BTreeMap<String, String>>| {
        map.iter()
            .flatten()
            .map(|(k, v)| format!("{k}=\"{v}\"\n"))
            .collect::<String>()
    };
    Some(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => render_map(&meta.labels),
        "metadata.annotations" => render_map(&meta.annotations),
        "spec.nodeName" => facts.node_name.clone(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        "status.podIP" | "status.podIPs" => facts.pod_ip.clone(),
        "status.hostIP" | "status.hostIPs" => facts.host_ip.clone(),
        p if p.starts_with("metadata.labels['") => map_entry(&meta.labels, "metadata.labels['")?,
        p if p.starts_with("metadata.annotations['") => {
            map_entry(&meta.annotations, "metadata.annotations['")?
        }
        _ => return None,
    })
}

/// Expands `$(NAME)` references to variables defined earlier; `$$(NAME)` escapes to `$(NAME)` and
/// unknown references stay as written, like the kubelet does.
pub fn expand(value: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix("$(") {
            out.push_str("$(");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('(') {
            match tail.find(')') {
                Some(end) => {
                    let name = &tail[..end];
                    match vars.get(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &tail[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = tail;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

struct Lookup<'a> {
    client: &'a Client,
    namespace: &'a str,
    container: &'a str,
}

impl Lookup<'_> {
    async fn secret(&self, name: &str) -> Result<Option<BTreeMap<String, String>>, EnvError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), self.namespace);
        let secret = api
            .get_opt(name)
            .await
            .map_err(|source| self.fetch_err("Secret", name, source))?;
        Ok(secret.map(|s| {
            s.data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect()
        }))
    }

    async fn config_map(&self, name: &str) -> Result<Option<BTreeMap<String, String>>, EnvError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.namespace);
        let cm = api
            .get_opt(name)
            .await
            .map_err(|source| self.fetch_err("ConfigMap", name, source))?;
        Ok(cm.map(|c| c.data.unwrap_or_default()))
    }

    fn fetch_err(&self, kind: &'static str, name: &str, source: kube::Error) -> EnvError {
        EnvError::Fetch {
            kind,
            namespace: self.namespace.to_string(),
            name: name.to_string(),
            container: self.container.to_string(),
            source,
        }
    }
}

/// The complete environment of `container`, in the order the kubelet builds it.
pub async fn container_env(
    client: &Client,
    pod: &Pod,
    container: &Container,
    facts: &PodFacts,
    apiserver: (&str, u16),
    run_as_root: bool,
) -> Result<Vec<(String, String)>, EnvError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let lookup = Lookup {
        client,
        namespace,
        container: &container.name,
    };
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut set = |vars: &mut BTreeMap<String, String>, k: String, v: String| {
        if vars.insert(k.clone(), v).is_none() {
            order.push(k);
        }
    };
    let (host, port) = apiserver;
    set(
        &mut vars,
        "PATH".into(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    );
    set(
        &mut vars,
        "HOME".into(),
        if run_as_root { "/root" } else { "/" }.into(),
    );
    set(
        &mut vars,
        "HOSTNAME".into(),
        pod.metadata.name.clone().unwrap_or_default(),
    );
    set(&mut vars, "KUBERNETES_SERVICE_HOST".into(), host.into());
    set(
        &mut vars,
        "KUBERNETES_SERVICE_PORT".into(),
        port.to_string(),
    );
    set(
        &mut vars,
        "KUBERNETES_SERVICE_PORT_HTTPS".into(),
        port.to_string(),
    );
    set(
        &mut vars,
        "KUBERNETES_PORT".into(),
        format!("tcp://{host}:{port}"),
    );

    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (kind, name, optional, data) = if let Some(r) = &from.secret_ref {
            (
                "Secret",
                r.name.clone(),
                r.optional.unwrap_or(false),
                lookup.secret(&r.name).await?,
            )
        } else if let Some(r) = &from.config_map_ref {
            (
                "ConfigMap",
                r.name.clone(),
                r.optional.unwrap_or(false),
                lookup.config_map(&r.name).await?,
            )
        } else {
            continue;
        };
        match data {
            Some(data) => {
                for (k, v) in data {
                    set(&mut vars, format!("{prefix}{k}"), v);
                }
            }
            None if optional => {}
            None => {
                return Err(EnvError::MissingObject {
                    kind,
                    name,
                    container: container.name.clone(),
                });
            }
        }
    }

    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (_, Some(source)) => match value_from(&lookup, pod, facts, &var.name, source).await? {
                Some(v) => v,
                None => continue,
            },
            (Some(v), None) => expand(v, &vars),
            (None, None) => String::new(),
        };
        set(&mut vars, var.name.clone(), value);
    }
    Ok(order
        .into_iter()
        .filter_map(|k| vars.get(&k).map(|v| (k.clone(), v.clone())))
        .collect())
}

/// Resolves one `valueFrom`; None when an optional key is absent (the variable is then not set).
async fn value_from(
    lookup: &Lookup<'_>,
    pod: &Pod,
    facts: &PodFacts,
    var: &str,
    source: &EnvVarSource,
) -> Result<Option<String>, EnvError> {
    let missing = |kind, name: &str, key: &str| EnvError::MissingKey {
        kind,
        name: name.to_string(),
        key: key.to_string(),
        container: lookup.container.to_string(),
        var: var.to_string(),
    };
    if let Some(r) = &source.secret_key_ref {
        let data = lookup.secret(&r.name).await?;
        return match data.and_then(|d| d.get(&r.key).cloned()) {
            Some(v) => Ok(Some(v)),
            None if r.optional.unwrap_or(false) => Ok(None),
            None => Err(missing("Secret", &r.name, &r.key)),
        };
    }
    if let Some(r) = &source.config_map_key_ref {
        let data = lookup.config_map(&r.name).await?;
        return match data.and_then(|d| d.get(&r.key).cloned()) {
            Some(v) => Ok(Some(v)),
            None if r.optional.unwrap_or(false) => Ok(None),
            None => Err(missing("ConfigMap", &r.name, &r.key)),
        };
    }
    if let Some(f) = &source.field_ref {
        return field_value(pod, facts, &f.field_path)
            .map(Some)
            .ok_or_else(|| EnvError::Unsupported {
                var: var.to_string(),
                container: lookup.container.to_string(),
                what: format!("fieldPath {}", f.field_path),
            });
    }
    Err(EnvError::Unsupported {
        var: var.to_string(),
        container: lookup.container.to_string(),
        what: "only secretKeyRef, configMapKeyRef and fieldRef are supported".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_replaces_known_vars_keeps_unknown_and_honours_escape() {
        let vars: BTreeMap<String, String> =
            [("A".to_string(), "1".to_string())].into_iter().collect();
        assert_eq!(expand("x$(A)y", &vars), "x1y");
        assert_eq!(expand("$(B)", &vars), "$(B)");
        assert_eq!(expand("$$(A)", &vars), "$(A)");
        assert_eq!(expand("cost $5 $(A", &vars), "cost $5 $(A");
    }

    #[test]
    fn field_value_reads_metadata_labels_and_facts() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.labels = Some([("app".to_string(), "x".to_string())].into_iter().collect());
        let facts = PodFacts {
            pod_ip: "127.1.0.2".into(),
            host_ip: "127.1.0.1".into(),
            node_name: "node-a".into(),
        };
        assert_eq!(field_value(&pod, &facts, "metadata.name").unwrap(), "p");
        assert_eq!(
            field_value(&pod, &facts, "metadata.namespace").unwrap(),
            "ns"
        );
        assert_eq!(
            field_value(&pod, &facts, "status.podIP").unwrap(),
            "127.1.0.2"
        );
        assert_eq!(
            field_value(&pod, &facts, "spec.nodeName").unwrap(),
            "node-a"
        );
        assert_eq!(
            field_value(&pod, &facts, "metadata.labels['app']").unwrap(),
            "x"
        );
        assert!(field_value(&pod, &facts, "spec.bogus").is_none());
    }
}
