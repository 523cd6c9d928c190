//! What the source halves calling this cluster last said, per destination Transfer (by UID).
//! Kept in memory: a source half calls every few seconds, so a restarted operator knows again
//! within one poll (and keeps running receivers meanwhile: the plan measures a silence from the
//! operator's own start at the earliest, and the time last heard is kept in the status).

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
    /// The source half said it is gone (it was deleted): the receiver stops at once.
    pub withdrawn: bool,
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
        let changed = m.get(uid).is_none_or(|old| {
            old.report != c.report || old.source != c.source || old.withdrawn != c.withdrawn
        });
        m.insert(uid.to_owned(), c);
        changed
    }

    /// The source half withdrew (it was deleted); returns whether that is news.
    pub fn withdraw(&self, uid: &str, c: Counterpart) -> bool {
        self.record(
            uid,
            Counterpart {
                report: None,
                withdrawn: true,
                ..c
            },
        )
    }

    pub fn get(&self, uid: &str) -> Option<Counterpart> {
        let m = self.halves.lock().unwrap_or_else(|p| p.into_inner());
        m.get(uid).cloned()
    }

    /// Forgets a destination Transfer that is gone.
    pub fn forget(&self, uid: &str) {
        let mut m = self.halves.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(uid);
    }
}
