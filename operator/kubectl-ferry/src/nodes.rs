//! `kubectl ferry nodes`: each node service's block store figures, read from its metrics
//! (Prometheus text) through the API server's pod proxy. Pure: parsing and the table.

use std::collections::BTreeMap;

use super::format::{human_age, human_bytes};
use super::table::Table;

/// The figures one node service reported, by metric name without the `ferry_node_store_`
/// prefix (`blocks`, `bytes`, `cap_bytes`, `hits_total`, ...).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFigures(pub BTreeMap<String, f64>);

impl NodeFigures {
    /// The `ferry_node_store_*` samples of a metrics page (comments and other metrics ignored).
    pub fn parse(text: &str) -> Self {
        let mut m = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some(rest) = line.strip_prefix("ferry_node_store_") else {
                continue;
            };
            let name_end = rest.find(['{', ' ']).unwrap_or(rest.len());
            let value = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            if let Some(v) = value {
                m.insert(rest[..name_end].to_owned(), v);
            }
        }
        NodeFigures(m)
    }

    fn get(&self, name: &str) -> Option<u64> {
        self.0.get(name).map(|v| *v as u64)
    }
}

/// One row: the node, the pod's state, and its figures when they could be read.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub node: String,
    pub pod: String,
    pub ready: bool,
    pub figures: Result<NodeFigures, String>,
}

/// The table of `kubectl ferry nodes` (`now` in Unix seconds, for the age of the last gc).
pub fn render(rows: &[NodeRow], now: i64) -> String {
    let mut t = Table::new([
        "NODE",
        "READY",
        "BLOCKS",
        "STORED",
        "CAP",
        "USED",
        "HITS",
        "HIT-BYTES",
        "ADDED",
        "EVICTED",
        "LAST-GC",
    ]);
    for r in rows {
        let ready = if r.ready { "yes" } else { "no" };
        match &r.figures {
            Ok(f) => {
                let (bytes, cap) = (f.get("bytes").unwrap_or(0), f.get("cap_bytes").unwrap_or(0));
                let used = bytes
                    .saturating_mul(100)
                    .checked_div(cap)
                    .map_or("-".into(), |p| format!("{p}%"));
                let gc = match f.get("last_gc_timestamp_seconds") {
                    Some(0) | None => "-".into(),
                    Some(t) => format!("{} ago", human_age(now - t as i64)),
                };
                let n = |k: &str| f.get(k).map_or("-".into(), |v| v.to_string());
                t.push([
                    r.node.clone(),
                    ready.into(),
                    n("blocks"),
                    human_bytes(bytes),
                    if cap > 0 {
                        human_bytes(cap)
                    } else {
                        "none".into()
                    },
                    used,
                    n("hits_total"),
                    human_bytes(f.get("hit_bytes_total").unwrap_or(0)),
                    n("inserted_total"),
                    n("evicted_total"),
                    gc,
                ]);
            }
            Err(e) => t.push([
                r.node.clone(),
                ready.into(),
                format!("(pod {}: {e})", r.pod),
            ]),
        }
    }
    if t.is_empty() {
        return "No node services found (the chart's nodeService.enabled runs one on every node).\n"
            .into();
    }
    t.render("")
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP ferry_node_store_blocks Blocks.\n# TYPE ferry_node_store_blocks gauge\n\
        ferry_node_store_blocks{node=\"node-a\"} 3\n\
        ferry_node_store_bytes{node=\"node-a\"} 12582912\n\
        ferry_node_store_cap_bytes{node=\"node-a\"} 25165824\n\
        ferry_node_store_hits_total{node=\"node-a\"} 2\n\
        ferry_node_store_hit_bytes_total{node=\"node-a\"} 8388608\n\
        ferry_node_store_inserted_total{node=\"node-a\"} 3\n\
        ferry_node_store_evicted_total{node=\"node-a\"} 0\n\
        ferry_node_store_last_gc_timestamp_seconds{node=\"node-a\"} 1000\n\
        other_metric 5\n";

    #[test]
    fn figures_are_read_from_the_metrics_page() {
        let f = NodeFigures::parse(PAGE);
        assert_eq!(f.get("blocks"), Some(3));
        assert_eq!(f.get("cap_bytes"), Some(24 << 20));
        assert_eq!(f.0.len(), 8);
    }

    #[test]
    fn the_table_shows_use_against_the_cap_and_unreadable_pods() {
        let rows = [
            NodeRow {
                node: "node-a".into(),
                pod: "ferry-node-1".into(),
                ready: true,
                figures: Ok(NodeFigures::parse(PAGE)),
            },
            NodeRow {
                node: "node-b".into(),
                pod: "ferry-node-2".into(),
                ready: false,
                figures: Err("connection refused".into()),
            },
        ];
        let text = render(&rows, 1060);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NODE"), "{text}");
        assert!(
            lines[1].contains("50%") && lines[1].contains("60s ago"),
            "{text}"
        );
        assert!(
            lines[2].contains("ferry-node-2: connection refused"),
            "{text}"
        );
    }
}
