//! The commands against the API server: read what each one shows, render it with the pure
//! modules and write it out.

use std::io::Write;
use std::pin::pin;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Config, ResourceExt};

use super::act::{self, SpecVerb};
use super::describe::{DescribeInput, render_describe};
use super::get::{GetLayout, render_get};
use super::logs::{failure_text, pod_title, pods_to_read};
use super::watch::{Outcome, Watch, frame};
use super::{Error, format};
use ferry_api::Transfer;
use ferry_api::names::{LABEL_TRANSFER_UID, MoverRole};

/// A client from the user's kubeconfig (`KUBECONFIG`, else `~/.kube/config`), with `context`
/// instead of the current context when given; also the context's namespace ("default" when it
/// names none).
pub async fn connect(context: Option<&str>) -> Result<(Client, String), Error> {
    let kubeconfig = Kubeconfig::read().map_err(kubeconfig_error)?;
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let config = Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(Error::Kubeconfig)?;
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(Error::Client)?;
    Ok((client, namespace))
}

fn kubeconfig_error(e: KubeconfigError) -> Error {
    match e {
        KubeconfigError::FindPath => Error::NoKubeconfig("~/.kube/config".into()),
        KubeconfigError::ReadConfig(io, path) if io.kind() == std::io::ErrorKind::NotFound => {
            if std::env::var_os("KUBECONFIG").is_some() {
                Error::KubeconfigMissing(path)
            } else {
                Error::NoKubeconfig(path.display().to_string())
            }
        }
        other => Error::Kubeconfig(other),
    }
}

/// Where `get` looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Namespace(String),
    AllNamespaces,
}

async fn get_transfer(api: &Api<Transfer>, namespace: &str, name: &str) -> Result<Transfer, Error> {
    api.get(name).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 404 && s.reason == "NotFound" => Error::NotFound {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
        e => api_error(format!("get transfer {namespace}/{name}"))(e),
    })
}

/// An API error, or [`Error::NoCrd`] when the API server does not serve Transfers at all (its
/// plain "404 page not found" rather than a NotFound Status).
fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| match &source {
        kube::Error::Api(s) if s.code == 404 && s.reason != "NotFound" => Error::NoCrd,
        _ => Error::Api { what, source },
    }
}

/// `get [NAME]`. An empty list says so on `err`, as kubectl does.
pub async fn get(
    client: &Client,
    scope: &Scope,
    name: Option<&str>,
    wide: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), Error> {
    let transfers = match (scope, name) {
        (Scope::Namespace(ns), Some(name)) => {
            vec![get_transfer(&Api::namespaced(client.clone(), ns), ns, name).await?]
        }
        (Scope::Namespace(ns), None) => {
            Api::<Transfer>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .map_err(api_error(format!("list transfers in namespace {ns}")))?
                .items
        }
        (Scope::AllNamespaces, name) => {
            let mut all = Api::<Transfer>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map_err(api_error("list transfers in all namespaces"))?
                .items;
            if let Some(name) = name {
                all.retain(|t| t.name_any() == name);
            }
            all
        }
    };
    if transfers.is_empty() {
        let text = match (scope, name) {
            (Scope::Namespace(ns), _) => format!("No transfers found in namespace {ns}.\n"),
            (Scope::AllNamespaces, Some(name)) => {
                format!("No transfer named {name:?} found in any namespace.\n")
            }
            (Scope::AllNamespaces, None) => "No transfers found.\n".to_owned(),
        };
        err.write_all(text.as_bytes()).map_err(Error::Output)?;
        // A name asked for and not found anywhere is an error, as `get NAME` in one namespace.
        if let (Scope::AllNamespaces, Some(name)) = (scope, name) {
            return Err(Error::NotFound {
                namespace: "*".into(),
                name: name.to_owned(),
            });
        }
        return Ok(());
    }
    let mut transfers = transfers;
    transfers.sort_by_key(|t| (t.namespace(), t.name_any()));
    let layout = GetLayout {
        namespace: *scope == Scope::AllNamespaces,
        wide,
    };
    out.write_all(render_get(&transfers, layout, Timestamp::now()).as_bytes())
        .map_err(Error::Output)
}

/// How `watch` ended (errors aside).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEnd {
    Succeeded,
    /// The Transfer failed; the final line was written.
    Failed,
    /// The Transfer was deleted while watched.
    Deleted,
    /// `--timeout` passed first; the last line seen, if any.
    TimedOut(Option<String>),
}

/// Consecutive watch errors tolerated (the watcher backs off between them) before giving up.
const WATCH_ERRORS: u32 = 6;

/// `watch NAME`: a progress line per change of the Transfer, from a watch on it, until it
/// finished, was deleted or `timeout` passed.
pub async fn watch(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Option<Duration>,
    tty: bool,
    out: &mut dyn Write,
) -> Result<WatchEnd, Error> {
    let api: Api<Transfer> = Api::namespaced(client.clone(), namespace);
    // A clear "not found" before watching (a watch of a missing name just waits).
    get_transfer(&api, namespace, name).await?;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = pin!(watcher(api, config).default_backoff());
    let mut state = Watch::new();
    let mut errors = 0;
    let mut write = |text: &str| {
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(Error::Output)
    };
    loop {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, events.next()).await {
                Ok(next) => next,
                Err(_) => {
                    if tty && state.last_line().is_some() {
                        write("\n")?;
                    }
                    return Ok(WatchEnd::TimedOut(state.last_line().map(str::to_owned)));
                }
            },
            None => events.next().await,
        };
        let event = match next {
            None => {
                return Err(Error::WatchEnded {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                });
            }
            Some(Err(source)) => {
                errors += 1;
                if errors >= WATCH_ERRORS {
                    return Err(Error::Watch {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        source,
                    });
                }
                continue;
            }
            Some(Ok(event)) => {
                errors = 0;
                event
            }
        };
        let transfer = match event {
            watcher::Event::Apply(t) | watcher::Event::InitApply(t) => t,
            watcher::Event::Delete(_) => {
                if tty && state.last_line().is_some() {
                    write("\n")?;
                }
                return Ok(WatchEnd::Deleted);
            }
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        let step = state.step(&transfer);
        if let Some(line) = &step.line {
            write(&frame(line, tty))?;
        }
        if let Some(outcome) = step.outcome {
            if tty {
                write("\n")?;
            }
            let (end, line) = match outcome {
                Outcome::Succeeded(line) => (WatchEnd::Succeeded, line),
                Outcome::Failed(line) => (WatchEnd::Failed, line),
            };
            write(&format!("{line}\n"))?;
            return Ok(end);
        }
    }
}

/// `describe NAME`. Pods and Events that cannot be listed are reported on `err`; the rest is
/// still shown.
pub async fn describe(
    client: &Client,
    namespace: &str,
    name: &str,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), Error> {
    let api: Api<Transfer> = Api::namespaced(client.clone(), namespace);
    let transfer = get_transfer(&api, namespace, name).await?;
    let uid = transfer.uid().unwrap_or_default();
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let events_api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let pods_params = ListParams::default().labels(&format!("{LABEL_TRANSFER_UID}={uid}"));
    let events_params = ListParams::default().fields(&format!("involvedObject.uid={uid}"));
    let (pods, events) = tokio::join!(pods_api.list(&pods_params), events_api.list(&events_params));
    let mut warnings = Vec::new();
    let pods = pods.map(|l| l.items).unwrap_or_else(|e| {
        warnings.push(format!(
            "warning: failed to list the pods of transfer {namespace}/{name}: {e}\n"
        ));
        Vec::new()
    });
    let events = events.map(|l| l.items).unwrap_or_else(|e| {
        warnings.push(format!(
            "warning: failed to list the events of transfer {namespace}/{name}: {e}\n"
        ));
        Vec::new()
    });
    let text = render_describe(&DescribeInput {
        transfer: &transfer,
        pods: &pods,
        events: &events,
        now: Timestamp::now(),
    });
    out.write_all(text.as_bytes()).map_err(Error::Output)?;
    for w in warnings {
        err.write_all(w.as_bytes()).map_err(Error::Output)?;
    }
    Ok(())
}

/// `logs NAME`: the mover container's log of each pod of the newest attempt. Returns false when
/// some could not be read (said on `err`, with the pods' names).
pub async fn logs(
    client: &Client,
    namespace: &str,
    name: &str,
    role: Option<MoverRole>,
    tail: Option<i64>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<bool, Error> {
    let api: Api<Transfer> = Api::namespaced(client.clone(), namespace);
    let transfer = get_transfer(&api, namespace, name).await?;
    let uid = transfer.uid().unwrap_or_default();
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pods = pods_api
        .list(&ListParams::default().labels(&format!("{LABEL_TRANSFER_UID}={uid}")))
        .await
        .map_err(api_error(format!(
            "list the pods of transfer {namespace}/{name}"
        )))?
        .items;
    let chosen = pods_to_read(&pods, role);
    if chosen.is_empty() {
        return Err(Error::NoPods {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            role: role
                .map(|r| format!(" with role {}", r.as_str()))
                .unwrap_or_default(),
        });
    }
    let mut failures = Vec::new();
    let headers = chosen.len() > 1;
    for pod in chosen {
        // The mover pods have one container (the mover).
        let params = LogParams {
            container: pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .map(|c| c.name.clone()),
            tail_lines: tail,
            ..LogParams::default()
        };
        match pods_api.logs(&pod.name_any(), &params).await {
            Ok(text) => {
                if headers {
                    out.write_all(format!("==> {} <==\n", pod_title(pod)).as_bytes())
                        .map_err(Error::Output)?;
                }
                out.write_all(text.as_bytes()).map_err(Error::Output)?;
                if !text.is_empty() && !text.ends_with('\n') {
                    out.write_all(b"\n").map_err(Error::Output)?;
                }
            }
            Err(e) => failures.push((pod_title(pod), error_chain(&e))),
        }
    }
    if failures.is_empty() {
        return Ok(true);
    }
    err.write_all(failure_text(namespace, name, &failures).as_bytes())
        .map_err(Error::Output)?;
    Ok(false)
}

/// `nodes`: the block store figures of every node service in `ferry_namespace`, read from each
/// pod's metrics port through the API server's pod proxy (needs `get pods/proxy` there).
pub async fn nodes(
    client: &Client,
    ferry_namespace: &str,
    out: &mut dyn Write,
) -> Result<(), Error> {
    use super::nodes::{NodeFigures, NodeRow};
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ferry_namespace);
    let pods = pods_api
        .list(&ListParams::default().labels(ferry_api::names::NODE_SERVICE_COMPONENT))
        .await
        .map_err(api_error(format!(
            "list the node service pods in namespace {ferry_namespace}"
        )))?
        .items;
    let mut rows = Vec::new();
    for pod in &pods {
        let name = pod.name_any();
        let spec = pod.spec.as_ref();
        let node = spec.and_then(|s| s.node_name.clone()).unwrap_or_default();
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let port = spec
            .and_then(|s| s.containers.first())
            .and_then(|c| c.ports.as_ref())
            .and_then(|p| p.iter().find(|p| p.name.as_deref() == Some("metrics")))
            .map(|p| p.container_port);
        let figures = match port {
            None => Err("no metrics port".to_owned()),
            Some(port) => {
                let path = format!(
                    "/api/v1/namespaces/{ferry_namespace}/pods/{name}:{port}/proxy/metrics"
                );
                match http::Request::get(path).body(Vec::new()) {
                    Ok(req) => client
                        .request_text(req)
                        .await
                        .map(|t| NodeFigures::parse(&t))
                        .map_err(|e| error_chain(&e)),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        rows.push(NodeRow {
            node,
            pod: name,
            ready,
            figures,
        });
    }
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    out.write_all(super::nodes::render(&rows, now).as_bytes())
        .map_err(Error::Output)
}

/// An error and its causes on one line. An API server's answer is shown by its message (and
/// HTTP code when it has none), not as the whole Status.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(kube::Error::Api(status)) = e.downcast_ref::<kube::Error>() {
            parts.push(match status.message.trim() {
                "" => format!("the API server answered HTTP {}", status.code),
                message => message.to_owned(),
            });
            break;
        }
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// "5m0s" for a `--timeout` in messages.
pub fn timeout_text(d: Duration) -> String {
    format::human_duration(d.as_secs())
}

/// The namespace of the kubeconfig's context (`context`, else the current one), without
/// contacting the cluster; `None` when there is no kubeconfig or the context names none.
pub fn kubeconfig_namespace(context: Option<&str>) -> Option<String> {
    let kubeconfig = Kubeconfig::read().ok()?;
    let name = context
        .map(str::to_owned)
        .or_else(|| kubeconfig.current_context.clone())?;
    kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == name)?
        .context
        .as_ref()?
        .namespace
        .clone()
}

/// `cp`: creates the Transfer `transfer` (as [`super::cp::transfer`] built it) and prints its
/// name, as kubectl does; returns the name.
pub async fn cp(
    client: &Client,
    transfer: &serde_json::Value,
    out: &mut dyn Write,
) -> Result<String, Error> {
    let t: Transfer = serde_json::from_value(transfer.clone()).map_err(Error::Spec)?;
    let namespace = t.namespace().unwrap_or_default();
    let api: Api<Transfer> = Api::namespaced(client.clone(), &namespace);
    let created = api
        .create(&kube::api::PostParams::default(), &t)
        .await
        .map_err(api_error(format!(
            "create a transfer in namespace {namespace}"
        )))?;
    let name = created.name_any();
    writeln!(out, "transfer.ferry.dev/{name} created").map_err(Error::Output)?;
    Ok(name)
}

/// `trigger`, `suspend`, `resume`: reads the Transfer, sends the merge patch the verb plans
/// (nothing when it is as asked already) and prints what happens next.
pub async fn act(
    client: &Client,
    namespace: &str,
    name: &str,
    verb: SpecVerb,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let api: Api<Transfer> = Api::namespaced(client.clone(), namespace);
    let t = get_transfer(&api, namespace, name).await?;
    let change = act::plan(verb, &t, Timestamp::now())?;
    if let Some(patch) = &change.patch {
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(api_error(format!(
                "{} transfer {namespace}/{name}",
                verb.name()
            )))?;
    }
    writeln!(out, "{}", change.message).map_err(Error::Output)
}

/// `delete`: deletes the Transfer (the operator removes its pods, Secrets and staging first)
/// and, with `wait`, returns once it is gone or `wait` passed.
pub async fn delete(
    client: &Client,
    namespace: &str,
    name: &str,
    wait: Option<Duration>,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let api: Api<Transfer> = Api::namespaced(client.clone(), namespace);
    let t = get_transfer(&api, namespace, name).await?;
    act::refuse_child(&t, "delete")?;
    let uid = t.uid().unwrap_or_default();
    api.delete(name, &DeleteParams::default())
        .await
        .map_err(api_error(format!("delete transfer {namespace}/{name}")))?;
    if let Some(limit) = wait {
        let gone = kube::runtime::wait::await_condition(
            api,
            name,
            kube::runtime::wait::conditions::is_deleted(&uid),
        );
        match tokio::time::timeout(limit, gone).await {
            Ok(Ok(_)) => {}
            Ok(Err(kube::runtime::wait::Error::ProbeFailed(source))) => {
                return Err(Error::Watch {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    source,
                });
            }
            Err(_) => {
                return Err(Error::NotDeleted {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    waited: timeout_text(limit),
                });
            }
        }
    }
    writeln!(out, "transfer.ferry.dev/{name} deleted").map_err(Error::Output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn api_errors_read_as_the_api_servers_message() {
        let logs = Error::Api {
            what: "read the log of pod x".into(),
            source: kube::Error::Api(Box::new(
                Status::failure("dial tcp: lookup node-a: no such host", "").with_code(500),
            )),
        };
        assert_eq!(
            error_chain(&logs),
            "failed to read the log of pod x: dial tcp: lookup node-a: no such host"
        );
        let bare = kube::Error::Api(Box::new(Status::failure("", "").with_code(503)));
        assert_eq!(error_chain(&bare), "the API server answered HTTP 503");
        let missing = Error::NotFound {
            namespace: "ml".into(),
            name: "x".into(),
        };
        assert_eq!(
            error_chain(&missing),
            "transfer \"x\" not found in namespace \"ml\""
        );
    }
}
