//! Concurrency limits (pure): how many Transfers may have movers at once, in the cluster and per
//! node. A Transfer over a limit waits (queued) until another one finishes.

use std::collections::BTreeSet;

/// An active Transfer as the limits see it: the nodes its movers run on (or must run on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Active {
    pub nodes: BTreeSet<String>,
}

/// Whether a Transfer whose movers go to `mine` may start next to `others` (0 = no limit).
pub fn admits(
    max_total: usize,
    max_per_node: usize,
    mine: &BTreeSet<String>,
    others: &[Active],
) -> bool {
    if max_total > 0 && others.len() >= max_total {
        return false;
    }
    if max_per_node == 0 {
        return true;
    }
    mine.iter()
        .all(|node| others.iter().filter(|o| o.nodes.contains(node)).count() < max_per_node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: &[&str]) -> BTreeSet<String> {
        n.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn cluster_and_node_limits() {
        let others = vec![
            Active {
                nodes: nodes(&["a", "b"]),
            },
            Active {
                nodes: nodes(&["b", "c"]),
            },
        ];
        assert!(admits(0, 0, &nodes(&["b"]), &others));
        assert!(!admits(2, 0, &nodes(&["x"]), &others));
        assert!(admits(3, 0, &nodes(&["x"]), &others));
        assert!(
            !admits(0, 2, &nodes(&["b", "d"]), &others),
            "b has two already"
        );
        assert!(admits(0, 2, &nodes(&["a", "d"]), &others));
        // A claim side without a known node counts only against the cluster limit.
        assert!(admits(0, 1, &nodes(&[]), &others));
    }
}
