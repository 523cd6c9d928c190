//! The metrics endpoint both binaries serve: their figures in Prometheus' text format (version
//! 0.0.4, written by the official `prometheus-client` crate from a [`Collector`] the binary
//! provides at each scrape) and the health probes, over plain HTTP/1.1 (nothing secret in it).
//!
//! Anyone who reaches the port may connect, so a client gets a bounded share: at most
//! [`MAX_CONNECTIONS`] connections are served at once (further ones wait in the kernel's
//! backlog), each answers one request and is closed after [`CONNECTION_DEADLINE`] whatever the
//! client does.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, EncodeMetric, prometheus_text,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use prometheus_client;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How long one connection may take, from accept to the end of its answer.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);

/// What a binary exposes on its metrics port.
pub trait Exposition: Send + Sync + 'static {
    /// This scrape's figures; `Err` (say, a store that cannot be read) answers 503 with its text.
    fn collect(&self) -> impl Future<Output = Result<Box<dyn Collector>, String>> + Send;

    /// Whether `/readyz` answers 200 (`/healthz` always does while the process serves).
    fn ready(&self) -> bool {
        true
    }
}

/// `collector`'s figures in Prometheus' text format.
pub fn render(collector: Box<dyn Collector>) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(collector);
    let mut text = String::new();
    prometheus_text::encode(&mut text, &registry)?;
    Ok(text)
}

/// One counter family of a collector: its description, then a sample per label set.
pub fn counters<L: EncodeLabelSet>(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = out.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        ConstCounter::new(v).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One gauge family of a collector: its description, then a sample per label set.
pub fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue + Send + Sync + std::fmt::Debug>(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, V)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = out.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        ConstGauge::new(v).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the process ends.
pub async fn serve<E: Exposition>(listener: TcpListener, exposition: Arc<E>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                // Out of descriptors, most likely: retrying at once would spin a core.
                tracing::debug!(error = %e, "metrics port: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let exposition = exposition.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let exposition = exposition.clone();
                async move { Ok::<_, Infallible>(answer(exposition.as_ref(), &request).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(conn), service);
            let _ = tokio::time::timeout(CONNECTION_DEADLINE, connection).await;
            drop(slot);
        });
    }
}

async fn answer<E: Exposition>(
    exposition: &E,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match request.uri().path() {
        "/metrics" => match exposition.collect().await.map(render) {
            Ok(Ok(body)) => respond(StatusCode::OK, prometheus_text::CONTENT_TYPE, body),
            Ok(Err(e)) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
            Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        },
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" if exposition.ready() => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "starting\n".into()),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    respond(status, "text/plain; charset=utf-8", body)
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[derive(Debug)]
    struct Figures(u64);

    impl Collector for Figures {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
            let counter = ConstCounter::new(self.0);
            let metric = encoder.encode_descriptor(
                "ferry_test_things",
                "Things counted.",
                None,
                counter.metric_type(),
            )?;
            counter.encode(metric)
        }
    }

    #[derive(Default)]
    struct Exposed {
        ready: AtomicBool,
        broken: AtomicBool,
    }

    impl Exposition for Exposed {
        async fn collect(&self) -> Result<Box<dyn Collector>, String> {
            if self.broken.load(Ordering::Relaxed) {
                return Err("the store cannot be read".into());
            }
            Ok(Box::new(Figures(7)))
        }
        fn ready(&self) -> bool {
            self.ready.load(Ordering::Relaxed)
        }
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        conn.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut out = String::new();
        conn.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn metrics_health_and_readiness_are_answered_and_a_failed_scrape_says_why() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let exposed = Arc::new(Exposed::default());
        tokio::spawn(serve(listener, exposed.clone()));

        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(
            metrics.contains("content-type: text/plain; version=0.0.4"),
            "{metrics}"
        );
        assert!(
            metrics.contains("# TYPE ferry_test_things_total counter\nferry_test_things_total 7\n"),
            "{metrics}"
        );
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        exposed.ready.store(true, Ordering::Relaxed);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/nothing").await.starts_with("HTTP/1.1 404"));
        exposed.broken.store(true, Ordering::Relaxed);
        let failed = get(addr, "/metrics").await;
        assert!(failed.starts_with("HTTP/1.1 503"), "{failed}");
        assert!(failed.contains("the store cannot be read"), "{failed}");
    }

    #[tokio::test]
    async fn idle_connections_hold_at_most_their_share_and_others_are_served_after_them() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, Arc::new(Exposed::default())));
        // Silent clients take every slot; a scrape waits in the backlog, never fails, and is
        // answered once a slot is free.
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }
        let scrape = tokio::spawn(async move { get(addr, "/healthz").await });
        idle.clear();
        let answer = tokio::time::timeout(Duration::from_secs(10), scrape)
            .await
            .expect("served once the idle clients left")
            .expect("task");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}
