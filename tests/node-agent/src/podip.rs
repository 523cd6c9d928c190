//! Pod addresses: every pod gets its own loopback address `127.<node>.x.y`. Linux routes all of
//! 127.0.0.0/8 to `lo`, so a process can bind any of them without configuration and pods on other
//! nodes (and the host) reach it.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
#[error("node {node} has no free pod address left in 127.{index}.0.0/16")]
pub struct ExhaustedError {
    pub node: String,
    pub index: u8,
}

/// Hands out the addresses of one node's /16; memory grows with live pods only.
#[derive(Debug)]
pub struct PodIpAllocator {
    node: String,
    index: u8,
    state: Mutex<AllocState>,
}

#[derive(Debug)]
struct AllocState {
    next: u16,
    in_use: HashSet<Ipv4Addr>,
}

impl PodIpAllocator {
    pub fn new(node: String, index: u8) -> Self {
        PodIpAllocator {
            node,
            index,
            state: Mutex::new(AllocState {
                next: 2,
                in_use: HashSet::new(),
            }),
        }
    }

    /// The next free address, round-robin so a released address is not reused at once.
    pub fn allocate(&self) -> Result<Ipv4Addr, ExhaustedError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..u16::MAX {
            let n = state.next;
            state.next = if n >= 0xfffe { 2 } else { n + 1 };
            let [hi, lo] = n.to_be_bytes();
            // .0.1 is the node itself; .x.0 and .x.255 are avoided for readability.
            if lo == 0 || lo == 255 || n < 2 {
                continue;
            }
            let ip = Ipv4Addr::new(127, self.index, hi, lo);
            if state.in_use.insert(ip) {
                return Ok(ip);
            }
        }
        Err(ExhaustedError {
            node: self.node.clone(),
            index: self.index,
        })
    }

    pub fn release(&self, ip: Ipv4Addr) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.in_use.remove(&ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_unique_within_the_node_range_and_reusable_after_release() {
        let a = PodIpAllocator::new("node-b".into(), 2);
        let first = a.allocate().unwrap();
        let second = a.allocate().unwrap();
        assert_ne!(first, second);
        assert_eq!(first.octets()[..2], [127, 2]);
        assert_ne!(first, Ipv4Addr::new(127, 2, 0, 1));
        a.release(first);
        let mut seen = HashSet::new();
        for _ in 0..1000 {
            assert!(seen.insert(a.allocate().unwrap()));
        }
        assert!(!seen.contains(&second));
    }
}
