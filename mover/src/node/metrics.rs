//! The node service's figures: the `Stats` reply and the same in Prometheus' text format on the
//! metrics port (plain HTTP, like the operator's; nothing secret in it). A scan of the store is
//! reused for [`SCAN_EVERY`], so a scraper cannot make the service walk the store continuously.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_proto::blockstore::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::counters::ServiceCounters;
use crate::cas::{CasStore, StoreStats};

/// How long one scan of the store answers for.
pub const SCAN_EVERY: Duration = Duration::from_secs(15);

/// The last scan of the store and when it ran.
#[derive(Default)]
pub struct ScanCache(Mutex<Option<(Instant, StoreStats)>>);

impl ScanCache {
    /// The store's figures, scanned again when the last scan is older than [`SCAN_EVERY`].
    pub fn get(&self, store: &CasStore) -> crate::cas::Result<StoreStats> {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, s)) = last.as_ref()
            && at.elapsed() < SCAN_EVERY
        {
            return Ok(s.clone());
        }
        let s = store.stats()?;
        *last = Some((Instant::now(), s.clone()));
        Ok(s)
    }
}

pub fn figures(node: &str, s: &StoreStats, c: &ServiceCounters) -> pb::StoreStats {
    pb::StoreStats {
        node: node.to_owned(),
        blocks: s.blocks,
        bytes: s.bytes,
        cap_bytes: s.cap_bytes.unwrap_or(0),
        hits: c.hits.load(Ordering::Relaxed),
        proofs_rejected: c.misses.load(Ordering::Relaxed),
        inserted: c.inserted.load(Ordering::Relaxed),
        last_gc_unix: c.last_gc_unix.load(Ordering::Relaxed),
        evicted: c.evicted.load(Ordering::Relaxed),
        puts_refused: c.put_refused.load(Ordering::Relaxed),
    }
}

/// The figures in the text exposition format, labelled with the node.
pub fn render(f: &pb::StoreStats, hit_bytes: u64, sends_expired: u64) -> String {
    let node = f.node.replace(['\\', '"', '\n'], "_");
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, v: u64| {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{node=\"{node}\"}} {v}\n"
        ));
    };
    metric(
        "ferry_node_store_blocks",
        "gauge",
        "Blocks in the node's block store.",
        f.blocks,
    );
    metric(
        "ferry_node_store_bytes",
        "gauge",
        "Bytes in the node's block store.",
        f.bytes,
    );
    metric(
        "ferry_node_store_cap_bytes",
        "gauge",
        "Cap of the node's block store (0: none).",
        f.cap_bytes,
    );
    metric(
        "ferry_node_store_hits_total",
        "counter",
        "Blocks handed to receivers against a proof of possession.",
        f.hits,
    );
    metric(
        "ferry_node_store_hit_bytes_total",
        "counter",
        "Bytes handed to receivers against a proof of possession.",
        hit_bytes,
    );
    metric(
        "ferry_node_store_misses_total",
        "counter",
        "Blocks asked for and not handed out: absent, not proven or corrupt, alike.",
        f.proofs_rejected,
    );
    metric(
        "ferry_node_store_inserted_total",
        "counter",
        "Blocks receivers added.",
        f.inserted,
    );
    metric(
        "ferry_node_store_sends_expired_total",
        "counter",
        "Blocks dropped because their client did not take them in time.",
        sends_expired,
    );
    metric(
        "ferry_node_store_puts_refused_total",
        "counter",
        "Blocks refused because their content did not match their hash.",
        f.puts_refused,
    );
    metric(
        "ferry_node_store_evicted_total",
        "counter",
        "Blocks the scheduled garbage collections evicted.",
        f.evicted,
    );
    metric(
        "ferry_node_store_last_gc_timestamp_seconds",
        "gauge",
        "Unix time of the last scheduled garbage collection (0: none yet).",
        f.last_gc_unix,
    );
    out
}

/// Serves GET /metrics and /healthz on `listener` until the process ends.
pub async fn serve(
    listener: TcpListener,
    node: String,
    store: Arc<CasStore>,
    counters: Arc<ServiceCounters>,
    scans: Arc<ScanCache>,
) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            // Out of descriptors, most likely: retrying at once would spin a core.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let (node, store, counters, scans) =
            (node.clone(), store.clone(), counters.clone(), scans.clone());
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n = match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("/");
            let (status, body) = match path {
                "/healthz" | "/readyz" => ("200 OK", "ok\n".to_owned()),
                "/metrics" => {
                    let scanned = tokio::task::spawn_blocking(move || {
                        scans.get(&store).map_err(|e| e.to_string())
                    })
                    .await;
                    match scanned {
                        Ok(Ok(s)) => (
                            "200 OK",
                            render(
                                &figures(&node, &s, &counters),
                                counters.hit_bytes.load(Ordering::Relaxed),
                                counters.sends_expired.load(Ordering::Relaxed),
                            ),
                        ),
                        Ok(Err(e)) => ("503 Service Unavailable", format!("{e}\n")),
                        Err(e) => ("500 Internal Server Error", format!("{e}\n")),
                    }
                }
                _ => ("404 Not Found", String::new()),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(resp.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_names_every_figure_once_with_the_node() {
        let f = pb::StoreStats {
            node: "node-a".into(),
            blocks: 3,
            bytes: 12 << 20,
            cap_bytes: 1 << 30,
            hits: 2,
            proofs_rejected: 1,
            inserted: 3,
            last_gc_unix: 1_700_000_000,
            evicted: 0,
            puts_refused: 4,
        };
        let text = render(&f, 8 << 20, 5);
        assert!(
            text.contains("ferry_node_store_blocks{node=\"node-a\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("ferry_node_store_cap_bytes{node=\"node-a\"} 1073741824\n"));
        assert!(text.contains("ferry_node_store_hit_bytes_total{node=\"node-a\"} 8388608\n"));
        assert!(text.contains("ferry_node_store_puts_refused_total{node=\"node-a\"} 4\n"));
        assert_eq!(text.matches("# TYPE ").count(), 11);
    }
}
