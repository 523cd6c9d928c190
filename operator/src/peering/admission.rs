//! Who gets in at the cross-cluster API's port, which faces networks that may not be trusted:
//! which new connections may start a TLS handshake (and whose unfinished handshake gives way when
//! all places are taken), and how many of the serving slots one authenticated peer cluster may
//! hold. Plain data structures with no I/O, so the rules are tested without sockets; the accept
//! loop in `server.rs` applies them.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Where handshakes come from, as far as limits go: an IPv4 address, or an IPv6 /64 (one host
/// is usually given a whole /64, so counting its addresses one by one would give it 2^64
/// budgets). An IPv4 address a dual-stack socket reports as `::ffff:a.b.c.d` is that address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Source(IpAddr);

impl Source {
    pub fn of(addr: IpAddr) -> Source {
        match addr.to_canonical() {
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                Source(IpAddr::V6(prefix.into()))
            }
            v4 => Source(v4),
        }
    }
}

/// A pending handshake's number; later connections get larger ones.
pub type Ticket = u64;

/// Bounds on handshakes under way.
#[derive(Clone, Copy, Debug)]
pub struct HandshakeLimits {
    /// In all.
    pub total: usize,
    /// From one [`Source`].
    pub per_source: usize,
}

/// What to do with a new connection before its handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Start its handshake.
    Admit(Ticket),
    /// End the handshake `evicted`, then start this one's.
    Evict { ticket: Ticket, evicted: Ticket },
    /// Close it at once.
    Refuse,
}

/// The handshakes under way, with their sources.
///
/// The rule, and why it keeps honest handshakes alive under a flood: an honest caller has one or
/// a few handshakes in flight, each done within a round trip; a flood has many, none finishing.
/// - A source at its limit is refused at once: it never pushes out anyone's handshake, its
///   own included (those keep their time to finish). One source alone therefore holds at most
///   `per_source` of the `total` places, never fills them and never evicts, whatever its rate.
/// - Only when sources together fill every place does someone's handshake end early, and it is
///   the oldest of the sources holding the most: a source with fewer handshakes under way (an
///   honest caller) loses one only once every flooding source is down to its count. A newcomer
///   whose source would then hold the most is refused instead of taking another's place.
///
/// What this cannot tell apart: callers behind one address (a NAT, or a Service that replaces the
/// client's address with a node's) share its budget, and a flood from more sources than `total`
/// each holding one handshake evicts the oldest, as before, since then nothing marks the flood.
#[derive(Debug)]
pub struct PendingHandshakes {
    limits: HandshakeLimits,
    next: Ticket,
    /// Ticket -> source, oldest first.
    tickets: BTreeMap<Ticket, Source>,
    per_source: HashMap<Source, usize>,
}

impl PendingHandshakes {
    pub fn new(limits: HandshakeLimits) -> PendingHandshakes {
        PendingHandshakes {
            limits,
            next: 0,
            tickets: BTreeMap::new(),
            per_source: HashMap::new(),
        }
    }

    /// Decides for a new connection from `addr`, and counts it when it may start.
    pub fn admit(&mut self, addr: IpAddr) -> Admission {
        let source = Source::of(addr);
        let own = self.per_source.get(&source).copied().unwrap_or(0);
        if own >= self.limits.per_source.max(1) {
            return Admission::Refuse;
        }
        let mut evicted = None;
        if self.tickets.len() >= self.limits.total.max(1) {
            let most = self.per_source.values().copied().max().unwrap_or(0);
            if own >= most {
                return Admission::Refuse;
            }
            let oldest = self
                .tickets
                .iter()
                .find(|(_, s)| self.per_source.get(s) == Some(&most))
                .map(|(t, _)| *t);
            if let Some(t) = oldest {
                self.done(t);
                evicted = Some(t);
            }
        }
        let ticket = self.next;
        self.next += 1;
        self.tickets.insert(ticket, source);
        *self.per_source.entry(source).or_default() += 1;
        match evicted {
            Some(evicted) => Admission::Evict { ticket, evicted },
            None => Admission::Admit(ticket),
        }
    }

    /// The handshake `ticket` ended (done, failed, timed out or evicted); again is harmless.
    pub fn done(&mut self, ticket: Ticket) {
        let Some(source) = self.tickets.remove(&ticket) else {
            return;
        };
        if let Some(n) = self.per_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&source);
            }
        }
    }

    /// Whether `ticket` is still under way.
    pub fn contains(&self, ticket: Ticket) -> bool {
        self.tickets.contains_key(&ticket)
    }
}

/// Whether a peer cluster holding `own` of the `held` slots in use (of `total`) may take one more.
///
/// A peer may hold at most half of the slots the other peers leave it (at least one). Alone it
/// gets half of them; a second peer still finds half of the rest, a third half of what remains,
/// and so on: one peer (a compromised cluster, a runaway operator) can never keep another out,
/// and it takes seven peers at their shares to fill all 64. Half rather than all, because an
/// honest peer's calls are short (one request per connection) and need few slots; the rate limit
/// per peer bounds its requests besides. A fixed half would let two peers fill everything.
pub fn may_serve(total: usize, held: usize, own: usize) -> bool {
    let others = held.saturating_sub(own);
    let share = (total.saturating_sub(others) / 2).max(1);
    held < total && own < share
}

/// The serving slots, counted in all and per peer cluster.
#[derive(Debug)]
pub struct ServingShares {
    total: usize,
    held: Mutex<(usize, HashMap<String, usize>)>,
}

/// A connection's serving slot, given back when it is dropped.
#[derive(Debug)]
pub struct ServingSlot {
    shares: Arc<ServingShares>,
    peer: String,
}

impl ServingShares {
    pub fn new(total: usize) -> Arc<ServingShares> {
        Arc::new(ServingShares {
            total,
            held: Mutex::new((0, HashMap::new())),
        })
    }

    /// A slot for a connection of `peer`, or `None` when it holds its share or all are taken.
    pub fn take(self: &Arc<Self>, peer: &str) -> Option<ServingSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let own = held.1.get(peer).copied().unwrap_or(0);
        if !may_serve(self.total, held.0, own) {
            return None;
        }
        held.0 += 1;
        *held.1.entry(peer.to_owned()).or_default() += 1;
        Some(ServingSlot {
            shares: self.clone(),
            peer: peer.to_owned(),
        })
    }

    /// Slots in use, in all and by `peer`.
    pub fn held(&self, peer: &str) -> (usize, usize) {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        (held.0, held.1.get(peer).copied().unwrap_or(0))
    }
}

impl Drop for ServingSlot {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|p| p.into_inner());
        held.0 = held.0.saturating_sub(1);
        if let Some(n) = held.1.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                held.1.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn table(total: usize, per_source: usize) -> PendingHandshakes {
        PendingHandshakes::new(HandshakeLimits { total, per_source })
    }

    fn admitted(a: Admission) -> Ticket {
        match a {
            Admission::Admit(t) | Admission::Evict { ticket: t, .. } => t,
            Admission::Refuse => panic!("refused"),
        }
    }

    #[test]
    fn a_flood_from_one_source_is_refused_and_evicts_nobody() {
        let mut p = table(64, 8);
        let honest = admitted(p.admit(ip(1)));
        let mut refused = 0;
        for i in 0..1000 {
            match p.admit(ip(2)) {
                Admission::Admit(_) => assert!(i < 8, "admitted beyond its limit"),
                Admission::Evict { evicted, .. } => panic!("the flood evicted {evicted}"),
                Admission::Refuse => refused += 1,
            }
        }
        assert_eq!(refused, 1000 - 8);
        assert!(p.contains(honest), "the honest handshake was ended");
        assert_eq!(p.tickets.len(), 9);
        // Another honest caller still gets a place.
        assert!(matches!(p.admit(ip(3)), Admission::Admit(_)));
    }

    #[test]
    fn a_full_table_evicts_the_oldest_of_the_busiest_source() {
        let mut p = table(4, 3);
        let a1 = admitted(p.admit(ip(1)));
        let b1 = admitted(p.admit(ip(2)));
        let b2 = admitted(p.admit(ip(2)));
        let c1 = admitted(p.admit(ip(3)));
        // Full: a newcomer ends b1, the oldest of the source with the most.
        let d1 = match p.admit(ip(4)) {
            Admission::Evict { ticket, evicted } => {
                assert_eq!(evicted, b1);
                ticket
            }
            other => panic!("{other:?}"),
        };
        assert!(p.contains(a1) && p.contains(b2) && p.contains(c1) && p.contains(d1));
        assert!(!p.contains(b1));
        // Every source holds one now: one of them asking for a second is refused rather than
        // pushing out another's.
        assert_eq!(p.admit(ip(1)), Admission::Refuse);
        // A source with none still gets in, in place of the oldest.
        assert_eq!(
            p.admit(ip(5)),
            Admission::Evict {
                ticket: d1 + 1,
                evicted: a1
            }
        );
    }

    #[test]
    fn a_flood_from_many_sources_cannot_end_a_lighter_sources_handshake() {
        // 16 flooding sources fill the table at their limit; an honest caller keeps its place
        // while the flood goes on, and gets in when it connects during it.
        let mut p = table(64, 4);
        let honest = admitted(p.admit(ip(200)));
        for round in 0..100 {
            for s in 0..16 {
                let a = p.admit(ip(s));
                if let Admission::Evict { evicted, .. } = a {
                    assert_ne!(evicted, honest, "round {round}");
                }
            }
        }
        assert!(p.contains(honest));
        let late = p.admit(ip(201));
        assert!(matches!(late, Admission::Evict { .. }), "{late:?}");
        assert!(p.contains(honest));
        assert_eq!(p.tickets.len(), 64);
    }

    #[test]
    fn ended_handshakes_give_their_place_back() {
        let mut p = table(2, 1);
        let a = admitted(p.admit(ip(1)));
        assert_eq!(p.admit(ip(1)), Admission::Refuse);
        p.done(a);
        p.done(a);
        assert_eq!(p.tickets.len(), 0);
        assert!(matches!(p.admit(ip(1)), Admission::Admit(_)));
    }

    #[test]
    fn an_ipv6_host_counts_as_one_source_per_64() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(Source::of(a), Source::of(b));
        assert_ne!(Source::of(a), Source::of(other));
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(Source::of(mapped), Source::of(IpAddr::from([10, 0, 0, 7])));
        assert_ne!(Source::of(ip(1)), Source::of(ip(2)));
        let mut p = table(64, 2);
        admitted(p.admit(a));
        admitted(p.admit(b));
        assert_eq!(
            p.admit("2001:db8:1:2::77".parse().unwrap()),
            Admission::Refuse
        );
    }

    #[test]
    fn one_peer_holds_at_most_half_and_leaves_room_for_others() {
        let shares = ServingShares::new(64);
        let west: Vec<_> = std::iter::from_fn(|| shares.take("west"))
            .take(100)
            .collect();
        assert_eq!(west.len(), 32, "one peer alone");
        let north: Vec<_> = std::iter::from_fn(|| shares.take("north"))
            .take(100)
            .collect();
        assert_eq!(north.len(), 16, "a second peer gets half of the rest");
        let east = shares.take("east");
        assert!(east.is_some(), "a third is still served");
        assert_eq!(shares.held("west"), (49, 32));
        drop(west);
        assert_eq!(shares.held("west"), (17, 0));
        assert!(shares.take("west").is_some(), "slots come back");
    }

    #[test]
    fn the_shares_never_exceed_the_total_however_many_peers() {
        for total in [1, 2, 3, 7, 64] {
            let mut held = 0;
            let mut per_peer = Vec::new();
            for _peer in 0..100 {
                let mut own = 0;
                while may_serve(total, held, own) {
                    own += 1;
                    held += 1;
                }
                per_peer.push(own);
            }
            assert!(held <= total, "total {total}: {held} held");
            assert_eq!(per_peer[0], (total / 2).max(1), "{per_peer:?}");
            assert_eq!(held, total, "total {total}: every slot can be used");
        }
        // 64 slots for the first seven peers at their shares, then none.
        let mut held = 0;
        let mut got = Vec::new();
        for _ in 0..8 {
            let mut own = 0;
            while may_serve(64, held, own) {
                own += 1;
                held += 1;
            }
            got.push(own);
        }
        assert_eq!(got, [32, 16, 8, 4, 2, 1, 1, 0]);
    }
}
