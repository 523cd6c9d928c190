//! What the source halves calling this cluster last said, per destination Transfer (by UID).
//! Kept in memory: a source half calls every few seconds, so a restarted operator knows again
//! within one poll.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;

use super::wire::{HalfRef, SenderReport};

/// The source half of one destination Transfer, as last heard.
#[derive(Debug, Clone, PartialEq)]
pub struct Counterpart {
    /// The Peer (object name here) whose cluster called.
    pub peer: String,
    pub source: HalfRef,
    pub report: Option<SenderReport>,
    pub last_call: Timestamp,
}

#[derive(Default)]
pub struct Registry {
    halves: Mutex<HashMap<String, Counterpart>>,
}

impl Registry {
    /// Records a call; returns whether anything the plan looks at changed (so a reconcile is
    /// worth waking).
    pub fn record(&self, uid: &str, c: Counterpart) -> bool {
        let mut m = self.halves.lock().unwrap_or_else(|p| p.into_inner());
        let changed = m
            .get(uid)
            .is_none_or(|old| old.report != c.report || old.source != c.source);
        m.insert(uid.to_owned(), c);
        changed
    }

    /// The source half withdrew (it was deleted).
    pub fn withdraw(&self, uid: &str) -> bool {
        let mut m = self.halves.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(uid).is_some()
    }

    pub fn get(&self, uid: &str) -> Option<Counterpart> {
        let m = self.halves.lock().unwrap_or_else(|p| p.into_inner());
        m.get(uid).cloned()
    }

    /// Forgets a destination Transfer that is gone.
    pub fn forget(&self, uid: &str) {
        self.withdraw(uid);
    }
}
