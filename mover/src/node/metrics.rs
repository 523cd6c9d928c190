//! The node service's figures: the `Stats` reply and the same on the metrics port (served by
//! [`ferry_proto::exposition`], like the operator's; nothing secret in it). A scan of the store is
//! reused for [`SCAN_EVERY`], so a scraper cannot make the service walk the store continuously.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_proto::blockstore::v1 as pb;
use ferry_proto::exposition::{self, Exposition};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

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

/// One scrape's figures, labelled with the node.
#[derive(Debug)]
pub struct NodeFigures {
    pub stats: pb::StoreStats,
    pub hit_bytes: u64,
    pub sends_expired: u64,
}

impl Collector for NodeFigures {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let f = &self.stats;
        let node = [("node", f.node.as_str())];
        let gauges = [
            (
                "ferry_node_store_blocks",
                "Blocks in the node's block store.",
                f.blocks,
            ),
            (
                "ferry_node_store_bytes",
                "Bytes in the node's block store.",
                f.bytes,
            ),
            (
                "ferry_node_store_cap_bytes",
                "Cap of the node's block store (0: none).",
                f.cap_bytes,
            ),
            (
                "ferry_node_store_last_gc_timestamp_seconds",
                "Unix time of the last scheduled garbage collection (0: none yet).",
                f.last_gc_unix,
            ),
        ];
        for (name, help, v) in gauges {
            exposition::gauges(&mut encoder, name, help, [(node, v)])?;
        }
        let counters = [
            (
                "ferry_node_store_hits",
                "Blocks handed to receivers against a proof of possession.",
                f.hits,
            ),
            (
                "ferry_node_store_hit_bytes",
                "Bytes handed to receivers against a proof of possession.",
                self.hit_bytes,
            ),
            (
                "ferry_node_store_misses",
                "Blocks asked for and not handed out: absent, not proven or corrupt, alike.",
                f.proofs_rejected,
            ),
            (
                "ferry_node_store_inserted",
                "Blocks receivers added.",
                f.inserted,
            ),
            (
                "ferry_node_store_sends_expired",
                "Blocks dropped because their client did not take them in time.",
                self.sends_expired,
            ),
            (
                "ferry_node_store_puts_refused",
                "Blocks refused because their content did not match their hash.",
                f.puts_refused,
            ),
            (
                "ferry_node_store_evicted",
                "Blocks the scheduled garbage collections evicted.",
                f.evicted,
            ),
        ];
        for (name, help, v) in counters {
            exposition::counters(&mut encoder, name, help, [(node, v)])?;
        }
        Ok(())
    }
}

/// What the node service serves on its metrics port.
pub struct NodeExposition {
    pub node: String,
    pub store: Arc<CasStore>,
    pub counters: Arc<ServiceCounters>,
    pub scans: Arc<ScanCache>,
}

impl Exposition for NodeExposition {
    async fn collect(&self) -> Result<Box<dyn Collector>, String> {
        let (store, scans) = (self.store.clone(), self.scans.clone());
        let scanned = tokio::task::spawn_blocking(move || scans.get(&store))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok(Box::new(NodeFigures {
            stats: figures(&self.node, &scanned, &self.counters),
            hit_bytes: self.counters.hit_bytes.load(Ordering::Relaxed),
            sends_expired: self.counters.sends_expired.load(Ordering::Relaxed),
        }))
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
        let text = ferry_proto::exposition::render(Box::new(NodeFigures {
            stats: f,
            hit_bytes: 8 << 20,
            sends_expired: 5,
        }))
        .expect("render");
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
