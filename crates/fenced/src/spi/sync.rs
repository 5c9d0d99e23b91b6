//! Small helpers over std's synchronisation.

/// Locks a std mutex, carrying on past a panic elsewhere (the data it
/// guards stays consistent between statements). Named so that it does not
/// read as the domain's "lock".
pub(crate) fn unpoisoned<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A value that tasks wait to see change: `tokio::sync::watch` for `Copy`
/// values, but waking its waiters in the order they began to wait.
///
/// Written by hand because tokio's watch spreads its waiters over eight
/// queues picked by a generator that stable tokio seeds at random, and
/// wakes them queue by queue: when a session ended, the holds on it heard
/// so in a different order from run to run, and the simulation could not
/// replay a seed. No well-kept crate offers a watch with a wake order;
/// this one is a mutex and a [`tokio::sync::Notify`], which wakes in order.
pub(crate) struct Watch<T: Copy> {
    shared: std::sync::Arc<Shared<T>>,
}

struct Shared<T> {
    /// The value, its version (one more per change), and whether the
    /// sender has gone (then it changes no more).
    state: std::sync::Mutex<(T, u64, bool)>,
    changed: tokio::sync::Notify,
}

/// The sender of a [`Watch`] is gone: the value will not change again.
#[derive(Debug)]
pub(crate) struct Closed;

impl<T: Copy> Watch<T> {
    pub(crate) fn new(value: T) -> Self {
        Watch {
            shared: std::sync::Arc::new(Shared {
                state: std::sync::Mutex::new((value, 0, false)),
                changed: tokio::sync::Notify::new(),
            }),
        }
    }

    /// The value now.
    pub(crate) fn get(&self) -> T {
        unpoisoned(&self.shared.state).0
    }

    /// A receiver that has seen the value now.
    pub(crate) fn subscribe(&self) -> Seen<T> {
        let version = unpoisoned(&self.shared.state).1;
        Seen {
            shared: self.shared.clone(),
            version,
        }
    }

    /// Changes the value with `f`; the receivers are told if `f` says it
    /// changed (returns true).
    pub(crate) fn send_if_modified(&self, f: impl FnOnce(&mut T) -> bool) -> bool {
        let mut s = unpoisoned(&self.shared.state);
        let modified = f(&mut s.0);
        if modified {
            s.1 += 1;
            drop(s);
            self.shared.changed.notify_waiters();
        }
        modified
    }

    /// Changes the value with `f` and tells the receivers.
    pub(crate) fn send_modify(&self, f: impl FnOnce(&mut T)) {
        self.send_if_modified(|v| {
            f(v);
            true
        });
    }

    /// Sets the value and tells the receivers.
    pub(crate) fn send_replace(&self, value: T) {
        self.send_modify(|v| *v = value);
    }
}

impl<T: Copy> Drop for Watch<T> {
    fn drop(&mut self) {
        unpoisoned(&self.shared.state).2 = true;
        self.shared.changed.notify_waiters();
    }
}

/// The receiving end of a [`Watch`]: the value, and which version of it
/// this receiver has seen.
#[derive(Clone)]
pub(crate) struct Seen<T> {
    shared: std::sync::Arc<Shared<T>>,
    version: u64,
}

impl<T: Copy + std::fmt::Debug> std::fmt::Debug for Seen<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Seen").field(&self.get()).finish()
    }
}

impl<T: Copy> Seen<T> {
    /// A receiver of `value` for good (its sender is already gone).
    pub(crate) fn fixed(value: T) -> Self {
        Seen {
            shared: std::sync::Arc::new(Shared {
                state: std::sync::Mutex::new((value, 0, true)),
                changed: tokio::sync::Notify::new(),
            }),
            version: 0,
        }
    }

    /// The value now.
    pub(crate) fn get(&self) -> T {
        unpoisoned(&self.shared.state).0
    }

    /// The value now, which this receiver has then seen.
    pub(crate) fn get_and_update(&mut self) -> T {
        let s = unpoisoned(&self.shared.state);
        self.version = s.1;
        s.0
    }

    /// Waits for a value this receiver has not seen, and marks it seen;
    /// `Err` once the sender has gone with nothing new.
    pub(crate) async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            // Waits from here on, so a change between the check and the
            // await is not missed.
            notified.as_mut().enable();
            {
                let s = unpoisoned(&self.shared.state);
                if s.1 != self.version {
                    self.version = s.1;
                    return Ok(());
                }
                if s.2 {
                    return Err(Closed);
                }
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_change_and_the_end_are_seen() {
        let w = Watch::new(1);
        let mut rx = w.subscribe();
        let waiting = tokio::spawn(async move {
            rx.changed().await.expect("a change");
            let first = rx.get_and_update();
            let end = rx.changed().await;
            (first, end.is_err(), rx.get())
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!w.send_if_modified(|_| false), "no change, nobody told");
        w.send_replace(2);
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(w);
        assert_eq!(waiting.await.unwrap(), (2, true, 2));
        let mut gone = Seen::fixed(7);
        assert!(gone.changed().await.is_err());
        assert_eq!(gone.get(), 7);
    }

    /// More waiters than one batch of `Notify::notify_waiters` (32), so
    /// the order across batches is checked too.
    #[tokio::test(start_paused = true)]
    async fn waiters_wake_in_the_order_they_began_to_wait() {
        let w = Watch::new(0);
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..100 {
            let (mut rx, order) = (w.subscribe(), order.clone());
            tasks.push(tokio::spawn(async move {
                rx.changed().await.expect("a change");
                order.lock().unwrap().push(i);
            }));
            // Each begins to wait before the next is spawned.
            tokio::task::yield_now().await;
        }
        w.send_replace(1);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..100).collect::<Vec<_>>());
    }
}
