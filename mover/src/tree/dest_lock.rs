//! One receiver per destination: an exclusive `flock` on the destination directory, held for the
//! receiver's whole life.
//!
//! Two receivers writing one directory interleave their renames and deletions (a `--delete`
//! listing of one removes what the other just published). The operator keeps two Transfers of
//! one cluster apart, but not a receiver it no longer knows about: the pod of a deleted Transfer
//! still terminating, or one started by hand. The lock lives on the directory's inode, so it holds
//! across processes and containers of one node (and across NFS clients, where `flock` is mapped
//! to the server's locks), and it goes away with the process however that ends.

use std::os::fd::AsFd;

use rustix::fs::{FlockOperation, flock};

/// Why the destination could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "the destination is in use by another receiver (it holds the lock on the directory); \
         two receivers never write one destination at once"
    )]
    Busy,
    #[error("failed to lock the destination directory: {0}")]
    Io(#[source] std::io::Error),
}

/// The lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DestLock {
    _dir: std::fs::File,
}

/// How often a receiver that waits for the lock tries again.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Takes the exclusive lock on `dir`, waiting up to `wait` for another receiver to let go: the
/// receiver of an earlier attempt may still be dying (the kubelet stops a force-deleted pod's
/// container after the API has forgotten the pod), and would otherwise fail the next attempt.
pub fn lock_destination_within(
    dir: &impl AsFd,
    wait: std::time::Duration,
) -> Result<DestLock, LockError> {
    let deadline = std::time::Instant::now() + wait;
    let mut told = false;
    loop {
        match lock_destination(dir) {
            Err(LockError::Busy) if std::time::Instant::now() < deadline => {
                if !told {
                    tracing::warn!(
                        wait_secs = wait.as_secs(),
                        "another receiver holds the destination; waiting for it to let go"
                    );
                    told = true;
                }
                std::thread::sleep(LOCK_POLL);
            }
            other => return other,
        }
    }
}

/// Takes the exclusive lock on `dir` (an open directory), without waiting.
pub fn lock_destination(dir: &impl AsFd) -> Result<DestLock, LockError> {
    // A separate open file description: the lock must not be shared with the caller's handle,
    // whose clones might be closed early.
    let own = rustix::fs::openat(
        dir,
        ".",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| LockError::Io(e.into()))?;
    match flock(&own, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(DestLock {
            _dir: std::fs::File::from(own),
        }),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(LockError::Busy),
        Err(e) => Err(LockError::Io(e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_receiver_of_one_directory_is_refused_until_the_first_lets_go() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = std::fs::File::open(tmp.path()).expect("open");
        let first = lock_destination(&dir).expect("first lock");
        let again = std::fs::File::open(tmp.path()).expect("open");
        assert!(matches!(lock_destination(&again), Err(LockError::Busy)));
        drop(first);
        lock_destination(&again).expect("free once the first is gone");
    }

    #[test]
    fn a_waiting_receiver_gets_the_lock_when_the_first_lets_go_and_not_before() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = std::fs::File::open(tmp.path()).expect("open");
        let first = lock_destination(&dir).expect("first lock");
        let again = std::fs::File::open(tmp.path()).expect("open");
        let short = lock_destination_within(&again, std::time::Duration::from_millis(300));
        assert!(matches!(short, Err(LockError::Busy)), "{short:?}");
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let got = lock_destination_within(&again, std::time::Duration::from_secs(60));
            tx.send(()).expect("send");
            got
        });
        // Still waiting while the first holds it.
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err()
        );
        drop(first);
        waiter
            .join()
            .expect("join")
            .expect("the lock once the first let go");
    }
}
