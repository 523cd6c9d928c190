//! Pod addresses: each node owns a /24 pod range (`Node.spec.podCIDR`); `.1` is the gateway address
//! on the node's end of every pod's veth, pods get `.2` to `.254`.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
#[error("node {node} has no free pod address left in {range}")]
pub struct ExhaustedError {
    pub node: String,
    pub range: PodRange,
}

/// A node's pod range: a /24.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodRange {
    base: [u8; 3],
}

impl PodRange {
    /// Parses `a.b.c.0/24`.
    pub fn parse(cidr: &str) -> Result<PodRange, String> {
        let (addr, len) = cidr
            .split_once('/')
            .ok_or_else(|| format!("pod CIDR {cidr:?} is not ADDRESS/24"))?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("pod CIDR {cidr:?}: {addr:?} is not an IPv4 address"))?;
        let [a, b, c, d] = addr.octets();
        if len != "24" || d != 0 {
            return Err(format!("pod CIDR {cidr:?} must be a /24 ending in .0"));
        }
        Ok(PodRange { base: [a, b, c] })
    }

    /// The address on the node's side of every pod's veth: pods' default gateway.
    pub fn gateway(&self) -> Ipv4Addr {
        self.host(1)
    }

    fn host(&self, n: u8) -> Ipv4Addr {
        let [a, b, c] = self.base;
        Ipv4Addr::new(a, b, c, n)
    }
}

impl std::fmt::Display for PodRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c] = self.base;
        write!(f, "{a}.{b}.{c}.0/24")
    }
}

/// Hands out the addresses of one node's range; memory grows with live pods only.
#[derive(Debug)]
pub struct PodIpAllocator {
    node: String,
    range: PodRange,
    state: Mutex<AllocState>,
}

#[derive(Debug)]
struct AllocState {
    next: u8,
    in_use: HashSet<Ipv4Addr>,
}

impl PodIpAllocator {
    pub fn new(node: String, range: PodRange) -> Self {
        PodIpAllocator {
            node,
            range,
            state: Mutex::new(AllocState {
                next: 2,
                in_use: HashSet::new(),
            }),
        }
    }

    /// The next free address, round-robin so a released address is not reused at once (a peer
    /// holding a stale address must not reach a new pod).
    pub fn allocate(&self) -> Result<Ipv4Addr, ExhaustedError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..=u8::MAX {
            let n = state.next;
            state.next = if n >= 254 { 2 } else { n + 1 };
            let ip = self.range.host(n);
            if state.in_use.insert(ip) {
                return Ok(ip);
            }
        }
        Err(ExhaustedError {
            node: self.node.clone(),
            range: self.range,
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
    fn addresses_stay_in_the_range_skip_the_gateway_and_are_reused_only_after_a_round() {
        let range = PodRange::parse("10.100.129.0/24").unwrap();
        assert_eq!(range.gateway(), Ipv4Addr::new(10, 100, 129, 1));
        let a = PodIpAllocator::new("node-a".into(), range);
        let first = a.allocate().unwrap();
        assert_eq!(first, Ipv4Addr::new(10, 100, 129, 2));
        a.release(first);
        let mut seen = HashSet::new();
        for _ in 0..253 {
            let ip = a.allocate().unwrap();
            assert_eq!(ip.octets()[..3], [10, 100, 129]);
            assert!(!matches!(ip.octets()[3], 0 | 1 | 255), "{ip}");
            assert!(seen.insert(ip));
        }
        assert!(a.allocate().is_err(), "all 253 addresses are in use");
    }

    #[test]
    fn only_a_slash_24_parses() {
        assert!(PodRange::parse("10.100.129.0/16").is_err());
        assert!(PodRange::parse("10.100.129.7/24").is_err());
        assert!(PodRange::parse("nonsense").is_err());
    }
}
