//! One local gate per mutex name and client: of a client's acquisitions
//! of one exclusive lock, only one at a time asks the server, and the rest
//! wait in this process, first come first served, until it lets go.
//!
//! Tasks that share a client exclude each other on an exclusive lock (each
//! acquisition is its own owner), so at most one of them can hold it at a
//! time anyway: serialising them here loses no concurrency. Without it,
//! each release woke every waiting task of the client, and every one of
//! them tried the server again: a thousand waiters cost a million tries
//! (the conformance suite's `a_thousand_waiters_of_one_client` took minutes
//! on the SQL lease tables and etcd, where one release wakes every waiter
//! of the name in the process). Shared and semaphore modes, where several
//! may hold at once, and acquisitions of a named owner (which may nest
//! into a hold the owner has) do not pass through a gate.

use crate::spi::sync::unpoisoned;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::{Mutex as Gate, OwnedMutexGuard};
use tokio::time::Instant;

/// A passage through a gate: held from before the first try until the
/// hold it led to ends (or the acquisition gave up).
pub(crate) type Pass = OwnedMutexGuard<()>;

/// The gates of one client, by name (a read-write lock's write side apart
/// from a mutex of the same name: their layouts differ on some engines).
#[derive(Default)]
pub(crate) struct Gates {
    gates: Mutex<HashMap<GateKey, Weak<Gate<()>>>>,
}

/// A lock's name, and whether it is a read-write lock's write side.
type GateKey = (String, bool);

impl Gates {
    fn gate(&self, name: &str, rw: bool) -> Arc<Gate<()>> {
        let mut gates = unpoisoned(&self.gates);
        let key = (name.to_owned(), rw);
        if let Some(g) = gates.get(&key).and_then(Weak::upgrade) {
            return g;
        }
        // Forget gates nobody uses any more before adding one.
        gates.retain(|_, g| g.strong_count() > 0);
        let g = Arc::new(Gate::new(()));
        gates.insert(key, Arc::downgrade(&g));
        g
    }

    /// Passes the gate of `name`: `None` when `until` passed first (or at
    /// once, for `try_once`, if another acquisition of this client is on
    /// it: the lock is held or about to be, by a task of this client).
    pub(crate) async fn pass(
        &self,
        name: &str,
        rw: bool,
        try_once: bool,
        until: Option<Instant>,
    ) -> Option<Pass> {
        let gate = self.gate(name, rw);
        if try_once {
            return gate.try_lock_owned().ok();
        }
        match until {
            None => Some(gate.lock_owned().await),
            Some(t) => tokio::time::timeout_at(t, gate.lock_owned()).await.ok(),
        }
    }
}
