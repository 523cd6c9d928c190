//! Who gets in at a shared TLS port (the node service, a progress port): how many handshakes may
//! be in progress and from where, how many verified connections a client may keep, and when a
//! connection nobody uses is closed. Every client is treated as possibly hostile: a flood of
//! connects from one address, a tenant opening connections by the hundred or keeping them idle
//! must not keep an honest client out.
//!
//! The rules are plain data structures (no I/O), so they are tested without sockets.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The bounds of one listening port.
#[derive(Debug, Clone, Copy)]
pub struct AcceptLimits {
    /// Handshakes in progress at once.
    pub pending: usize,
    /// Handshakes in progress at once from one address.
    pub pending_per_address: usize,
    /// Verified connections open at once.
    pub connections: usize,
    /// Verified connections open at once for one client (its certificate's Transfer).
    pub connections_per_client: usize,
    /// A handshake not done by then is dropped.
    pub handshake_timeout: Duration,
    /// A connection with no request open for this long is closed.
    pub idle: Duration,
}

impl Default for AcceptLimits {
    fn default() -> Self {
        Self {
            pending: 64,
            pending_per_address: 8,
            connections: 256,
            connections_per_client: 8,
            handshake_timeout: Duration::from_secs(10),
            idle: Duration::from_secs(300),
        }
    }
}

impl AcceptLimits {
    /// These limits with `connections` lowered so that open connections and handshakes stay
    /// well below the process's file descriptor limit: a port that runs out of descriptors
    /// refuses everyone, honest clients included.
    pub fn within_fd_limit(mut self) -> Self {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct on the stack.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            let room = usize::try_from(lim.rlim_cur / 2).unwrap_or(usize::MAX);
            let room = room.saturating_sub(self.pending).max(8);
            self.connections = self.connections.min(room);
        }
        self
    }
}

/// What to do with a new connection before its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Start its handshake.
    Admit,
    /// Start its handshake after dropping the pending handshake with this ticket.
    Evict(u64),
}

/// The handshakes in progress. When the port is full, the oldest handshake of the address with
/// the most pending goes: a flood from one address (or a few) evicts only its own handshakes,
/// so an honest client connecting from anywhere else completes its handshake whatever the rate
/// of the flood. An address at its own limit likewise evicts its own oldest.
#[derive(Debug, Default)]
pub struct PendingHandshakes {
    next: u64,
    /// Ticket -> address, oldest first.
    tickets: BTreeMap<u64, IpAddr>,
    per_address: HashMap<IpAddr, usize>,
}

impl PendingHandshakes {
    /// Decides for a connection from `addr` and records it; returns its ticket and what to do.
    pub fn admit(&mut self, addr: IpAddr, limits: &AcceptLimits) -> (u64, Admission) {
        let own = self.per_address.get(&addr).copied().unwrap_or(0);
        let evict = if own >= limits.pending_per_address.max(1) {
            self.oldest_of(addr)
        } else if self.tickets.len() >= limits.pending.max(1) {
            self.busiest().and_then(|a| self.oldest_of(a))
        } else {
            None
        };
        if let Some(t) = evict {
            self.done(t);
        }
        let ticket = self.next;
        self.next += 1;
        self.tickets.insert(ticket, addr);
        *self.per_address.entry(addr).or_default() += 1;
        (ticket, evict.map_or(Admission::Admit, Admission::Evict))
    }

    /// The handshake with `ticket` ended (done, failed or evicted).
    pub fn done(&mut self, ticket: u64) {
        if let Some(addr) = self.tickets.remove(&ticket)
            && let Some(n) = self.per_address.get_mut(&addr)
        {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&addr);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.tickets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tickets.is_empty()
    }

    fn oldest_of(&self, addr: IpAddr) -> Option<u64> {
        self.tickets
            .iter()
            .find(|(_, a)| **a == addr)
            .map(|(t, _)| *t)
    }

    fn busiest(&self) -> Option<IpAddr> {
        self.per_address
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(a, _)| *a)
    }
}

/// Verified connections open, in all and per client.
#[derive(Debug)]
pub struct ConnectionSlots {
    limits: AcceptLimits,
    open: Mutex<(usize, HashMap<String, usize>)>,
}

/// A connection's slot, given back when the connection closes.
#[derive(Debug)]
pub struct ConnectionSlot {
    slots: Arc<ConnectionSlots>,
    client: String,
}

impl ConnectionSlots {
    pub fn new(limits: AcceptLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            open: Mutex::new((0, HashMap::new())),
        })
    }

    /// A slot for a connection of `client`, or `None` when the port or the client is full.
    pub fn take(self: &Arc<Self>, client: &str) -> Option<ConnectionSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let own = open.1.get(client).copied().unwrap_or(0);
        if open.0 >= self.limits.connections || own >= self.limits.connections_per_client {
            return None;
        }
        open.0 += 1;
        *open.1.entry(client.to_owned()).or_default() += 1;
        Some(ConnectionSlot {
            slots: self.clone(),
            client: client.to_owned(),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).0
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(n) = open.1.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.client);
            }
        }
    }
}

/// Requests open on one connection, and since when none is: a connection idle for longer than
/// its limit is closed (HTTP/2 keepalive pings only tell that the client is alive, not that it
/// needs the connection).
#[derive(Debug)]
pub struct ConnActivity {
    born: Instant,
    open: AtomicUsize,
    /// Milliseconds after `born` when the last request ended (or the connection opened).
    idle_since_ms: AtomicU64,
}

impl Default for ConnActivity {
    fn default() -> Self {
        Self {
            born: Instant::now(),
            open: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
        }
    }
}

/// A request in progress on a connection; ending it (drop) may start the connection's idle time.
#[derive(Debug)]
pub struct InUse(Arc<ConnActivity>);

impl ConnActivity {
    /// Marks a request as open until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InUse {
        self.open.fetch_add(1, Ordering::AcqRel);
        InUse(self.clone())
    }

    /// Whether the connection had no request open for at least `limit`.
    pub fn idle_for(&self, limit: Duration) -> bool {
        if self.open.load(Ordering::Acquire) > 0 {
            return false;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        self.born.elapsed().saturating_sub(since) >= limit
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        let now = u64::try_from(self.0.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.idle_since_ms.store(now, Ordering::Release);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn limits(pending: usize, per_address: usize) -> AcceptLimits {
        AcceptLimits {
            pending,
            pending_per_address: per_address,
            ..AcceptLimits::default()
        }
    }

    #[test]
    fn a_flood_from_one_address_evicts_only_its_own_handshakes() {
        let l = limits(8, 4);
        let mut p = PendingHandshakes::default();
        let (honest, a) = p.admit(ip(1), &l);
        assert_eq!(a, Admission::Admit);
        let mut flood = Vec::new();
        for _ in 0..1000 {
            let (t, a) = p.admit(ip(2), &l);
            if let Admission::Evict(old) = a {
                assert!(
                    flood.contains(&old),
                    "evicted {old}, not one of the flood's"
                );
                flood.retain(|&f| f != old);
            }
            flood.push(t);
        }
        assert!(
            p.tickets.contains_key(&honest),
            "the honest handshake was evicted"
        );
        assert_eq!(p.per_address[&ip(2)], 4);
        assert_eq!(p.len(), 5);
    }

    #[test]
    fn a_full_port_evicts_the_oldest_of_the_busiest_address() {
        let l = limits(4, 4);
        let mut p = PendingHandshakes::default();
        let (a1, _) = p.admit(ip(1), &l);
        let (b1, _) = p.admit(ip(2), &l);
        let (b2, _) = p.admit(ip(2), &l);
        let (c1, _) = p.admit(ip(3), &l);
        let (_, d) = p.admit(ip(4), &l);
        assert_eq!(d, Admission::Evict(b1));
        assert!(p.tickets.contains_key(&a1) && p.tickets.contains_key(&b2));
        assert!(p.tickets.contains_key(&c1));
        p.done(a1);
        p.done(a1);
        assert_eq!(p.len(), 3);
        assert!(!p.per_address.contains_key(&ip(1)));
    }

    #[test]
    fn connections_are_bounded_in_all_and_per_client_and_given_back() {
        let slots = ConnectionSlots::new(AcceptLimits {
            connections: 3,
            connections_per_client: 2,
            ..AcceptLimits::default()
        });
        let a1 = slots.take("a").unwrap();
        let _a2 = slots.take("a").unwrap();
        assert!(slots.take("a").is_none(), "a third for one client");
        let _b1 = slots.take("b").unwrap();
        assert!(slots.take("c").is_none(), "a fourth in all");
        drop(a1);
        assert_eq!(slots.open(), 2);
        assert!(slots.take("c").is_some());
    }

    #[test]
    fn a_connection_is_idle_only_with_no_request_open() {
        let a = Arc::new(ConnActivity::default());
        assert!(a.idle_for(Duration::ZERO));
        assert!(!a.idle_for(Duration::from_secs(60)));
        let r = a.begin();
        assert!(!a.idle_for(Duration::ZERO));
        drop(r);
        assert!(a.idle_for(Duration::ZERO));
    }
}
