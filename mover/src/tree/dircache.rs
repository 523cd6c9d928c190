//! Directory handles the receiver reuses. The sender offers a directory's files together, so
//! each directory is resolved beneath the root once instead of twice per file (a lookup and a
//! create each cost an `openat2` walk before).

use std::sync::Mutex;

use crate::tree::DirFd;

/// Enough for the directories of every stream's in-flight batches.
const CAPACITY: usize = 64;

/// A cached directory handle.
#[derive(Debug, Clone)]
pub struct CachedDir {
    pub fd: DirFd,
    /// This session created the directory, so nothing in it predates the session: a name not
    /// offered yet cannot exist there and need not be looked up.
    pub fresh: bool,
}

/// A small most-recently-used list of directory handles keyed by their path beneath the root
/// (raw bytes, as names need not be UTF-8).
#[derive(Debug, Default)]
pub struct DirCache {
    /// Most recently used last.
    slots: Mutex<Vec<(Vec<u8>, CachedDir)>>,
}

impl DirCache {
    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<(Vec<u8>, CachedDir)>> {
        // Every operation leaves the list consistent, so a panic elsewhere cannot corrupt it.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, dir: &[u8]) -> Option<CachedDir> {
        let mut slots = self.slots();
        let at = slots.iter().rposition(|(k, _)| k == dir)?;
        let hit = slots.remove(at);
        let found = hit.1.clone();
        slots.push(hit);
        Some(found)
    }

    pub fn insert(&self, dir: &[u8], entry: CachedDir) {
        let mut slots = self.slots();
        slots.retain(|(k, _)| k != dir);
        if slots.len() >= CAPACITY {
            slots.remove(0);
        }
        slots.push((dir.to_vec(), entry));
    }

    pub fn clear(&self) {
        self.slots().clear();
    }

    /// Forgets `path` and everything beneath it (it is about to be replaced or removed).
    pub fn forget_under(&self, path: &[u8]) {
        self.slots().retain(|(k, _)| {
            !(k == path || (k.starts_with(path) && k.get(path.len()) == Some(&b'/')))
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn dir(fresh: bool) -> CachedDir {
        let fd = std::fs::File::open("/").expect("open /");
        CachedDir {
            fd: Arc::new(fd.into()),
            fresh,
        }
    }

    #[test]
    fn least_recently_used_goes_first_and_forget_takes_descendants_only() {
        let cache = DirCache::default();
        for i in 0..CAPACITY {
            cache.insert(format!("d{i}").as_bytes(), dir(i % 2 == 0));
        }
        assert!(cache.get(b"d0").is_some_and(|d| d.fresh));
        cache.insert(b"new", dir(false));
        // d0 was used last, so d1 (the oldest) made room.
        assert!(cache.get(b"d1").is_none());
        assert!(cache.get(b"d0").is_some());
        cache.insert(b"a/b", dir(false));
        cache.insert(b"a/bc", dir(false));
        cache.insert(b"a/b/c", dir(false));
        cache.forget_under(b"a/b");
        assert!(cache.get(b"a/b").is_none() && cache.get(b"a/b/c").is_none());
        assert!(cache.get(b"a/bc").is_some());
    }
}
