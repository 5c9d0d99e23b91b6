//! Wake-ups for blocked acquirers.
//!
//! Each backend turns its engine's notification (a release in the same
//! process, a datagram from another process, Redis pub/sub, a ZooKeeper
//! watch, PostgreSQL NOTIFY) into [`Wakeups::bump`] for the lock name.
//! Waiters read the name's version before they attempt and wait for it to
//! change, so a bump that lands between the attempt and the wait is never
//! missed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

#[derive(Default)]
pub(crate) struct Wakeups {
    names: Mutex<HashMap<Arc<str>, Entry>>,
}

struct Entry {
    tx: watch::Sender<u64>,
    interest: usize,
}

impl Wakeups {
    /// Tells the waiters of `name` to look again. Cheap when nobody waits.
    pub(crate) fn bump(&self, name: &str) {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = names.get(name) {
            e.tx.send_modify(|v| *v += 1);
        }
    }

    /// Declares interest in `name` until the returned handle drops.
    pub(crate) fn interest(self: &Arc<Self>, name: &str) -> Interest {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let entry = names.entry(name.into()).or_insert_with(|| Entry {
            tx: watch::Sender::new(0),
            interest: 0,
        });
        entry.interest += 1;
        Interest {
            rx: entry.tx.subscribe(),
            name: name.into(),
            owner: self.clone(),
        }
    }

    /// Tells every waiter to look again (after a lost notification channel).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn bump_all(&self) {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        for e in names.values() {
            e.tx.send_modify(|v| *v += 1);
        }
    }

    /// Whether anyone waits on `name` now.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn has_interest(&self, name: &str) -> bool {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        names.contains_key(name)
    }

    /// How many names have waiters (for tests and status).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.names.lock().unwrap().len()
    }
}

/// A waiter's interest in one name.
pub(crate) struct Interest {
    rx: watch::Receiver<u64>,
    name: Arc<str>,
    owner: Arc<Wakeups>,
}

impl Interest {
    /// The version to compare against after an attempt.
    pub(crate) fn version(&self) -> u64 {
        *self.rx.borrow()
    }

    /// Resolves once the version differs from `seen`.
    pub(crate) async fn changed_since(&mut self, seen: u64) {
        // The sender lives in the map while any Interest does, so this
        // only errs if the map was torn down; treat that as a change.
        let _ = self.rx.wait_for(|v| *v != seen).await;
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut names = self.owner.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = names.get_mut(&self.name) {
            e.interest -= 1;
            if e.interest == 0 {
                names.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bump_between_attempt_and_wait_is_seen() {
        let w = Arc::new(Wakeups::default());
        let mut i = w.interest("a");
        let seen = i.version();
        w.bump("a");
        w.bump("b"); // nobody listens: no entry is made
        tokio::time::timeout(std::time::Duration::from_secs(5), i.changed_since(seen))
            .await
            .expect("woken");
        assert_eq!(w.len(), 1);
        drop(i);
        assert_eq!(w.len(), 0);
    }
}
