//! Each client's share of the node service. A client is its certificate's Transfer; any tenant
//! can hold such a certificate, so nothing one client does may take the service away from the
//! others: store reads, blocks on their way out, waiting fan-out Takes and Puts in flight are
//! bounded for the whole service *and* per client, and every wait for a turn has a deadline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// Store reads running at once over all clients (each `Take` reads its blocks one at a time on
/// a blocking thread), and per client.
pub const MAX_CONCURRENT_TAKES: usize = 8;
pub const READERS_PER_CLIENT: usize = 4;
/// Blocks (4 MiB each) read for Takes and not yet sent, over all clients (64 MiB) and per
/// client: see [`super::outgoing`].
pub const MAX_OUTGOING_BLOCKS: usize = 16;
pub const PLACES_PER_CLIENT: usize = 8;
/// Fan-out Takes waiting at once (they hold no reader while waiting, only a small task), over
/// all clients and per client (a fan-out receiver runs at most 10 fetches per fellow).
pub const MAX_WAITING_TAKES: usize = 256;
pub const WAITING_PER_CLIENT: usize = 32;
/// Puts whose block is being received or stored at once, over all clients (32 MiB of blocks)
/// and per client (a receiver runs 2 put workers).
pub const MAX_PUTS: usize = 8;
pub const PUTS_PER_CLIENT: usize = 2;

/// The longest a request waits for its turn at the store's readers or for a Put slot. Turns are
/// held only as long as the deadlines of [`super::outgoing`] and of a Put allow, so a turn
/// that does not come in this time means the service is overloaded: the client is told so
/// (`RESOURCE_EXHAUSTED`) and its blocks come over the wire.
pub const TURN_WAIT: Duration = Duration::from_secs(30);

/// One bound, as a pair of semaphores: the service's and the client's own.
#[derive(Debug, Clone)]
pub struct Bound {
    global: Arc<Semaphore>,
    own: Arc<Semaphore>,
}

/// A turn under a [`Bound`]: one permit of the client's own and one of the service's.
#[derive(Debug)]
pub struct Turn {
    _own: OwnedSemaphorePermit,
    _global: OwnedSemaphorePermit,
}

impl Bound {
    /// Waits at most `wait` for a turn: the client's own permit first, so a client waiting
    /// behind its own requests holds none of the service's.
    pub async fn acquire(&self, wait: Duration) -> Option<Turn> {
        tokio::time::timeout(wait, async {
            let own = self.own.clone().acquire_owned().await.ok()?;
            let global = self.global.clone().acquire_owned().await.ok()?;
            Some(Turn {
                _own: own,
                _global: global,
            })
        })
        .await
        .ok()
        .flatten()
    }

    /// A turn now, or none.
    pub fn try_acquire(&self) -> Option<Turn> {
        let own = self.own.clone().try_acquire_owned().ok()?;
        let global = self.global.clone().try_acquire_owned().ok()?;
        Some(Turn {
            _own: own,
            _global: global,
        })
    }
}

/// One client's bounds.
#[derive(Debug)]
pub struct ClientShare {
    pub readers: Bound,
    pub places: Bound,
    pub waiting: Bound,
    pub puts: Bound,
}

/// The service's bounds and each client's share of them.
#[derive(Debug)]
pub struct Shares {
    readers: Arc<Semaphore>,
    places: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
    puts: Arc<Semaphore>,
    /// Shares of the clients with a request open (an entry lives while a request holds it).
    clients: Mutex<HashMap<String, Weak<ClientShare>>>,
}

impl Default for Shares {
    fn default() -> Self {
        Self {
            readers: Arc::new(Semaphore::new(MAX_CONCURRENT_TAKES)),
            places: Arc::new(Semaphore::new(MAX_OUTGOING_BLOCKS)),
            waiting: Arc::new(Semaphore::new(MAX_WAITING_TAKES)),
            puts: Arc::new(Semaphore::new(MAX_PUTS)),
            clients: Mutex::new(HashMap::new()),
        }
    }
}

impl Shares {
    /// `client`'s share (the same one for all its requests open at once).
    pub fn of(&self, client: &str) -> Arc<ClientShare> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(share) = clients.get(client).and_then(Weak::upgrade) {
            return share;
        }
        // Entries of clients with nothing open are dropped as the map grows.
        if clients.len() >= 64 && clients.len().is_power_of_two() {
            clients.retain(|_, w| w.strong_count() > 0);
        }
        let bound = |global: &Arc<Semaphore>, own: usize| Bound {
            global: global.clone(),
            own: Arc::new(Semaphore::new(own)),
        };
        let share = Arc::new(ClientShare {
            readers: bound(&self.readers, READERS_PER_CLIENT),
            places: bound(&self.places, PLACES_PER_CLIENT),
            waiting: bound(&self.waiting, WAITING_PER_CLIENT),
            puts: bound(&self.puts, PUTS_PER_CLIENT),
        });
        clients.insert(client.to_owned(), Arc::downgrade(&share));
        share
    }
}

/// The answer to a request that found no turn in time.
pub fn busy(what: &str) -> Status {
    Status::resource_exhausted(format!(
        "the node service is busy ({what}); the blocks come over the wire"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_client_holds_its_share_and_another_still_gets_a_turn() {
        let shares = Shares::default();
        let greedy = shares.of("mallory");
        let mut held = Vec::new();
        while let Some(t) = greedy.readers.try_acquire() {
            held.push(t);
        }
        assert_eq!(held.len(), READERS_PER_CLIENT);
        assert!(
            greedy
                .readers
                .acquire(Duration::from_millis(20))
                .await
                .is_none(),
            "beyond its share"
        );
        let honest = shares.of("alice");
        assert!(honest.readers.try_acquire().is_some());
        // The same client's requests share one share.
        assert!(shares.of("mallory").readers.try_acquire().is_none());
        drop(held);
        assert!(greedy.readers.try_acquire().is_some());
    }

    #[tokio::test]
    async fn the_services_bound_holds_over_many_clients() {
        let shares = Shares::default();
        let clients: Vec<_> = (0..MAX_OUTGOING_BLOCKS)
            .map(|i| shares.of(&format!("c{i}")))
            .collect();
        let held: Vec<_> = clients
            .iter()
            .filter_map(|c| c.places.try_acquire())
            .collect();
        assert_eq!(held.len(), MAX_OUTGOING_BLOCKS);
        assert!(shares.of("late").places.try_acquire().is_none());
    }
}
