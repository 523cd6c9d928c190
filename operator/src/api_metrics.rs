//! Counts the operator's Kubernetes API requests (`ferry_api_requests_total{verb,resource,code}`)
//! with a tower layer around the kube client's HTTP service:
//!
//! ```no_run
//! # async fn f(metrics: std::sync::Arc<ferry_operator::metrics::Metrics>) -> anyhow::Result<()> {
//! let client = ferry_operator::api_metrics::client(metrics).await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response, Uri};
use tower::{Layer, Service};

use crate::metrics::Metrics;

/// A kube client configured as `kube::Client::try_default` does (in-cluster or KUBECONFIG) whose
/// requests are counted in `metrics`.
pub async fn client(metrics: Arc<Metrics>) -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&ApiMetricsLayer::new(metrics))
        .build())
}

/// Wraps a service of HTTP requests to the Kubernetes API and counts each request by verb,
/// resource and response status in the shared [`Metrics`].
#[derive(Clone)]
pub struct ApiMetricsLayer {
    metrics: Arc<Metrics>,
}

impl ApiMetricsLayer {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for ApiMetricsLayer {
    type Service = ApiMetrics<S>;
    fn layer(&self, inner: S) -> ApiMetrics<S> {
        ApiMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`ApiMetricsLayer`] makes.
#[derive(Clone)]
pub struct ApiMetrics<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ApiMetrics<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (verb, resource) = classify(req.method(), req.uri());
        let metrics = self.metrics.clone();
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            // A watch counts when its response starts (200), not when its stream ends.
            let code = match &result {
                Ok(r) => r.status().as_str().to_owned(),
                Err(_) => "error".to_owned(),
            };
            metrics.api_request(verb, &resource, &code);
            result
        })
    }
}

/// The Kubernetes verb and resource of a request: `get`, `list`, `watch` (`?watch=true` or a
/// `/watch/` path), `create` (POST), `update` (PUT), `patch`, `delete` and `deletecollection`
/// (DELETE of a collection); the resource is the plural name after the namespace or the
/// group/version (`pods`, `transfers`), with its subresource (`transfers/status`). Discovery
/// paths (`/api`, `/apis/ferry.dev/v1alpha1`) are `discovery`, anything else (`/version`) is
/// `other`.
pub fn classify(method: &Method, uri: &Uri) -> (&'static str, String) {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        ["api" | "apis", ..] => &[][..],
        _ => return (method_verb(method, true, false), "other".to_owned()),
    };
    if rest.is_empty() {
        return (method_verb(method, false, false), "discovery".to_owned());
    }
    let (watch_path, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        rest => (false, rest),
    };
    // namespaces/<ns>/<resource>/..., unless it is the Namespace itself (namespaces/<name>, or
    // its subresources status and finalize).
    let rest = match rest {
        ["namespaces", _ns, sub] if matches!(*sub, "status" | "finalize") => rest,
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    let (resource, named) = match rest {
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
        [] => ("discovery".to_owned(), false),
    };
    let watch = watch_path
        || uri.query().is_some_and(|q| {
            q.split('&')
                .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch"))
        });
    (method_verb(method, named, watch), resource)
}

fn method_verb(method: &Method, named: bool, watch: bool) -> &'static str {
    match *method {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        Method::HEAD => "head",
        Method::OPTIONS => "options",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(method: Method, uri: &str, verb: &str, resource: &str) {
        let uri: Uri = uri.parse().expect("a URI");
        assert_eq!(
            classify(&method, &uri),
            (verb, resource.to_owned()),
            "{method} {uri}"
        );
    }

    #[test]
    fn core_and_group_paths_give_verb_and_resource() {
        check(Method::GET, "/api/v1/namespaces/x/pods/y", "get", "pods");
        check(Method::GET, "/api/v1/namespaces/x/pods", "list", "pods");
        check(
            Method::GET,
            "/api/v1/namespaces/x/pods?labelSelector=a%3Db&limit=500",
            "list",
            "pods",
        );
        check(Method::GET, "/api/v1/pods", "list", "pods");
        check(Method::GET, "/api/v1/nodes/n1", "get", "nodes");
        check(
            Method::GET,
            "/apis/ferry.dev/v1alpha1/transfers",
            "list",
            "transfers",
        );
        check(
            Method::GET,
            "/apis/ferry.dev/v1alpha1/namespaces/ml/transfers/t",
            "get",
            "transfers",
        );
        check(Method::POST, "/api/v1/namespaces/x/pods", "create", "pods");
        check(
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/ferry-system/leases/ferry-operator",
            "update",
            "leases",
        );
        check(
            Method::PATCH,
            "/apis/ferry.dev/v1alpha1/namespaces/ml/transfers/t/status",
            "patch",
            "transfers/status",
        );
        check(
            Method::PATCH,
            "/apis/ferry.dev/v1alpha1/namespaces/ml/transfers/t?fieldManager=ferry&force=true",
            "patch",
            "transfers",
        );
        check(
            Method::DELETE,
            "/api/v1/namespaces/x/secrets/s",
            "delete",
            "secrets",
        );
        check(
            Method::DELETE,
            "/api/v1/namespaces/x/pods?labelSelector=a",
            "deletecollection",
            "pods",
        );
        check(
            Method::POST,
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            "create",
            "selfsubjectreviews",
        );
        check(
            Method::POST,
            "/api/v1/namespaces/x/pods/p/eviction",
            "create",
            "pods/eviction",
        );
    }

    #[test]
    fn watches_by_query_or_path() {
        check(
            Method::GET,
            "/apis/ferry.dev/v1alpha1/transfers?watch=true&resourceVersion=5&timeoutSeconds=290",
            "watch",
            "transfers",
        );
        check(
            Method::GET,
            "/api/v1/namespaces/x/pods?labelSelector=a&watch=1",
            "watch",
            "pods",
        );
        check(
            Method::GET,
            "/api/v1/watch/namespaces/x/pods",
            "watch",
            "pods",
        );
        check(Method::GET, "/api/v1/watch/pods", "watch", "pods");
        check(
            Method::GET,
            "/api/v1/namespaces/x/pods?watch=false",
            "list",
            "pods",
        );
    }

    #[test]
    fn namespaces_themselves() {
        check(Method::GET, "/api/v1/namespaces", "list", "namespaces");
        check(Method::GET, "/api/v1/namespaces/ml", "get", "namespaces");
        check(
            Method::PUT,
            "/api/v1/namespaces/ml/finalize",
            "update",
            "namespaces/finalize",
        );
        check(
            Method::GET,
            "/api/v1/namespaces/ml/status",
            "get",
            "namespaces/status",
        );
    }

    #[test]
    fn discovery_and_other_paths() {
        check(Method::GET, "/api", "list", "discovery");
        check(Method::GET, "/api/v1", "list", "discovery");
        check(Method::GET, "/apis", "list", "discovery");
        check(Method::GET, "/apis/ferry.dev", "list", "discovery");
        check(Method::GET, "/apis/ferry.dev/v1alpha1", "list", "discovery");
        check(Method::GET, "/version", "get", "other");
        check(Method::GET, "/openapi/v3", "get", "other");
    }

    #[tokio::test]
    async fn the_layer_counts_responses_and_errors() {
        use tower::ServiceExt as _;
        let metrics = Arc::new(Metrics::default());
        let layer = ApiMetricsLayer::new(metrics.clone());
        let ok = layer.layer(tower::service_fn(|req: Request<()>| async move {
            let status = if req.uri().path().ends_with("/missing") {
                404
            } else {
                200
            };
            Ok::<_, std::io::Error>(
                Response::builder()
                    .status(status)
                    .body(())
                    .expect("a response"),
            )
        }));
        let req = |method: Method, uri: &str| {
            Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .expect("a request")
        };
        ok.clone()
            .oneshot(req(
                Method::PATCH,
                "/apis/ferry.dev/v1alpha1/namespaces/ml/transfers/t/status",
            ))
            .await
            .expect("patched");
        ok.clone()
            .oneshot(req(Method::GET, "/api/v1/namespaces/ml/pods/missing"))
            .await
            .expect("answered");
        let failing = layer.layer(tower::service_fn(|_: Request<()>| async {
            Err::<Response<()>, _>(std::io::Error::other("connection refused"))
        }));
        assert!(
            failing
                .oneshot(req(Method::GET, "/api/v1/namespaces/ml/pods"))
                .await
                .is_err()
        );
        let text = metrics.render();
        for want in [
            "ferry_api_requests_total{verb=\"patch\",resource=\"transfers/status\",code=\"200\"} 1",
            "ferry_api_requests_total{verb=\"get\",resource=\"pods\",code=\"404\"} 1",
            "ferry_api_requests_total{verb=\"list\",resource=\"pods\",code=\"error\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing in:\n{text}");
        }
    }
}
