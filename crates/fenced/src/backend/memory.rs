//! `memory://[NAMESPACE]`: locks inside this process.
//!
//! For examples, unit tests and single-process programs. Every client that
//! connects to the same namespace shares one store, so two clients in one
//! process contend as two processes would. The store lives as long as the
//! process; tokens still follow the wall-clock floor of
//! [`next_token`](crate::spi::grant::next_token), so a register kept
//! outside the process sees them rise across restarts too.
//!
//! Guarantee: exact, with expiry by this process's monotonic clock.

use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::grant::{Held, grantable, next_token, permits_differ};
use crate::spi::lease::QUEUE_TTL;
use crate::spi::rate::{RateCost, gcra};
use crate::spi::sync::unpoisoned;
use crate::spi::wake::Wakeups;
use crate::spi::wake::register_key;
use crate::spi::{
    Attempt, Backend, Blocked, Decrement, HoldRef, HolderInfo, LockBackend, LockStatus, Mode,
    Outcome, RegisterValue, RegisterWrite, Renewal, Reply, Store, Ticket, Withdrawal,
};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use tokio::time::Instant;

static SPACES: LazyLock<Mutex<HashMap<String, Arc<Space>>>> = LazyLock::new(Default::default);

/// The memory backend's clock starts here: its rate limiters count µs
/// from it.
static BORN: LazyLock<Instant> = LazyLock::new(Instant::now);

/// One namespace: its locks, registers, and the wake-ups of every client
/// connected to it.
#[derive(Default)]
struct Space {
    locks: Mutex<Locks>,
    registers: Mutex<HashMap<LockName, (Vec<u8>, u64)>>,
    /// Rate limiters' TATs, in µs since [`BORN`].
    rates: Mutex<HashMap<LockName, u64>>,
    clients: Mutex<Vec<std::sync::Weak<Wakeups>>>,
    next_ticket: Mutex<Ticket>,
}

/// The names with holds or waiters. A name with neither is dropped, so
/// the map holds what is in use, not every name ever used; its last token
/// goes into `floor`, where every name's next token starts from, so a
/// dropped name's tokens still rise.
#[derive(Default)]
struct Locks {
    names: HashMap<LockName, Resource>,
    floor: u64,
}

impl Locks {
    /// The name's entry, made (above the floor) if missing.
    fn entry(&mut self, name: &LockName) -> &mut Resource {
        let floor = self.floor;
        self.names.entry(name.clone()).or_insert_with(|| Resource {
            last_token: floor,
            ..Resource::default()
        })
    }

    /// Drops the entry of `name` if nothing holds or waits on it.
    fn tidy(&mut self, name: &LockName) {
        if let Some(res) = self.names.get(name)
            && res.holds.is_empty()
            && res.queue.is_empty()
        {
            self.floor = self.floor.max(res.last_token);
            self.names.remove(name);
        }
    }
}

#[derive(Default)]
struct Resource {
    holds: Vec<MemHold>,
    /// Fair waiters' places: ticket, expiry, and the hold id that took
    /// it, so that a retry, or a withdrawal, whose reply with the ticket
    /// was lost still finds it.
    queue: Vec<(Ticket, Instant, String)>,
    last_token: u64,
}

struct MemHold {
    hold_id: String,
    owner_key: String,
    mode: Mode,
    token: u64,
    expires: Instant,
    holder: Option<crate::Holder>,
}

impl Space {
    /// Wakes the waiters of `name` in every client of this namespace,
    /// forgetting clients that are gone.
    fn wake(&self, name: &str) {
        let mut clients = unpoisoned(&self.clients);
        clients.retain(|w| match w.upgrade() {
            Some(w) => {
                w.wake(name);
                true
            }
            None => false,
        });
    }
}

impl Resource {
    /// Drops expired holds and queue places; true if any hold went.
    fn purge(&mut self, now: Instant) -> bool {
        let before = self.holds.len();
        self.holds.retain(|h| h.expires > now);
        self.queue.retain(|(_, exp, _)| *exp > now);
        self.holds.len() != before
    }
}

pub(crate) struct MemoryBackend {
    store: Arc<Space>,
    namespace: String,
}

impl MemoryBackend {
    pub(crate) fn open(namespace: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
        if namespace.chars().any(char::is_control) || namespace.len() > 256 {
            return Err(Error::invalid(format!(
                "memory namespace {namespace:?} must be at most 256 bytes with no control characters"
            )));
        }
        let mut spaces = unpoisoned(&SPACES);
        let store = spaces.entry(namespace.to_owned()).or_default().clone();
        let mut clients = unpoisoned(&store.clients);
        // Clients that are gone are forgotten here too, so a namespace
        // where clients come and go without a release does not grow.
        clients.retain(|w| w.strong_count() > 0);
        clients.push(Arc::downgrade(&wakeups));
        drop(clients);
        Ok(Arc::new(MemoryBackend {
            store,
            namespace: namespace.to_owned(),
        }))
    }

    fn locks(&self) -> MutexGuard<'_, Locks> {
        unpoisoned(&self.store.locks)
    }

    fn registers(&self) -> MutexGuard<'_, HashMap<LockName, (Vec<u8>, u64)>> {
        unpoisoned(&self.store.registers)
    }

    fn ticket(&self) -> Ticket {
        let mut t = unpoisoned(&self.store.next_ticket);
        *t += 1;
        *t
    }

    fn try_grant(&self, req: &Attempt) -> Outcome {
        let now = Instant::now();
        let mut locks = self.locks();
        let res = locks.entry(&req.name);
        let mut changed = res.purge(now);
        // A retry of an attempt whose answer was lost finds its grant:
        // attempts are idempotent by hold id, as on every other backend.
        let again = res.holds.iter().find(|h| h.hold_id == req.hold_id);
        if let Some(token) = again.map(|h| h.token) {
            drop(locks);
            if changed {
                self.store.wake(req.name.as_str());
            }
            return Outcome::granted(token);
        }
        let mine = res
            .queue
            .iter()
            .find(|(q, _, id)| req.ticket == Some(*q) || *id == req.hold_id)
            .map(|p| p.0);
        let queued_ahead = match mine {
            Some(t) => res.queue.iter().any(|(q, _, _)| *q < t),
            None => !res.queue.is_empty(),
        };
        let holders = res.holds.iter().map(|h| Held {
            owner_key: &h.owner_key,
            mode: h.mode,
        });
        let decision = grantable(holders, &req.owner_key, req.mode, req.fair, queued_ahead);
        let outcome = if let Err(theirs) = decision {
            Outcome::Refused(permits_differ(
                req.name.as_str(),
                theirs,
                req.mode.permits().1,
            ))
        } else if decision == Ok(true) {
            let token = next_token(res.last_token);
            res.last_token = token;
            res.holds.push(MemHold {
                hold_id: req.hold_id.clone(),
                owner_key: req.owner_key.clone(),
                mode: req.mode,
                token,
                expires: now + req.lease,
                holder: crate::Holder::decode(req.holder.as_bytes()),
            });
            if let Some(t) = mine {
                res.queue.retain(|(q, _, _)| *q != t);
                changed = true; // the next in line may go now
            }
            Outcome::granted(token)
        } else {
            let ticket = if req.fair && req.will_wait {
                let t = match mine {
                    Some(t) => t,
                    None => {
                        let t = self.ticket();
                        res.queue.push((t, now, req.hold_id.clone()));
                        t
                    }
                };
                if let Some(q) = res.queue.iter_mut().find(|(q, _, _)| *q == t) {
                    q.1 = now + QUEUE_TTL;
                }
                Some(t)
            } else {
                None
            };
            let retry_after = res.holds.iter().map(|h| h.expires - now).min();
            Outcome::Busy(Blocked {
                ticket,
                retry_after,
            })
        };
        locks.tidy(&req.name);
        drop(locks);
        if changed {
            self.store.wake(req.name.as_str());
        }
        outcome
    }

    fn remove_hold(&self, name: &LockName, hold_id: &str) -> bool {
        let now = Instant::now();
        let mut locks = self.locks();
        let Some(res) = locks.names.get_mut(name) else {
            return false;
        };
        let Some(i) = res.holds.iter().position(|h| h.hold_id == hold_id) else {
            return false;
        };
        let h = res.holds.swap_remove(i);
        res.purge(now);
        locks.tidy(name);
        drop(locks);
        self.store.wake(name.as_str());
        h.expires > now
    }
}

impl LockBackend for MemoryBackend {
    fn doctor(&self) -> Reply<'_, Vec<crate::doctor::Check>> {
        Box::pin(async {
            Ok(vec![crate::doctor::Check::new(
                "scope",
                crate::doctor::Verdict::Warn,
                "memory:// lives in this process: other processes, and other hosts, see none \
                 of its locks",
            )])
        })
    }

    fn scheme(&self) -> &'static str {
        "memory"
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        Box::pin(async move { Ok(self.try_grant(req)) })
    }

    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut locks = self.locks();
            Ok(holds
                .iter()
                .map(|r| {
                    let renewed = locks
                        .names
                        .get_mut(&r.name)
                        .and_then(|res| res.holds.iter_mut().find(|h| h.hold_id == r.hold_id))
                        .filter(|h| h.expires > now)
                        .map(|h| h.expires = now + r.lease);
                    Renewal::from(renewed.is_some())
                })
                .collect())
        })
    }

    fn identity(&self) -> String {
        format!("memory://{}", self.namespace)
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> Reply<'a, bool> {
        Box::pin(async move { Ok(self.remove_hold(&hold.name, &hold.hold_id)) })
    }

    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()> {
        Box::pin(async move {
            let name = &gone.name;
            let mut changed = false;
            {
                let mut locks = self.locks();
                if let Some(res) = locks.names.get_mut(name) {
                    let before = res.queue.len();
                    res.queue
                        .retain(|(q, _, id)| gone.ticket != Some(*q) && *id != gone.hold_id);
                    changed = res.queue.len() != before;
                }
                locks.tidy(name);
            }
            // Only a hold or a queue place gone can let a waiter in; a
            // hold found wakes them in `remove_hold`.
            self.remove_hold(name, &gone.hold_id);
            if changed {
                self.store.wake(name.as_str());
            }
            Ok(())
        })
    }

    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut locks = self.locks();
            let mut names = Vec::new();
            for (name, res) in locks.names.iter_mut() {
                if name.as_str().starts_with(prefix) {
                    res.purge(now);
                    if !res.holds.is_empty() || !res.queue.is_empty() {
                        names.push(name.clone());
                    }
                }
            }
            Ok(names)
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        Box::pin(async move {
            let now = Instant::now();
            let mut locks = self.locks();
            let floor = locks.floor;
            let Some(res) = locks.names.get_mut(name) else {
                return Ok(LockStatus {
                    last_token: floor,
                    ..LockStatus::default()
                });
            };
            res.purge(now);
            Ok(LockStatus {
                holders: res
                    .holds
                    .iter()
                    .map(|h| HolderInfo {
                        owner: h.owner_key.clone(),
                        mode: h.mode,
                        token: h.token,
                        lease_left: h.expires - now,
                        holder: h.holder.clone(),
                    })
                    .collect(),
                waiters: res.queue.len(),
                last_token: res.last_token,
            })
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize> {
        Box::pin(async move {
            let mut locks = self.locks();
            let n = locks
                .names
                .get_mut(name)
                .map(|res| std::mem::take(&mut res.holds).len())
                .unwrap_or(0);
            locks.tidy(name);
            drop(locks);
            self.store.wake(name.as_str());
            Ok(n)
        })
    }
}

impl Store for MemoryBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        Box::pin(async move { Ok(self.registers().get(name).cloned()) })
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        Box::pin(async move {
            let mut regs = self.registers();
            let old = regs.get(write.name).map(|(v, f)| (v.as_slice(), *f));
            let Some(new) = write.over(old)? else {
                return Ok(false);
            };
            regs.insert(write.name.clone(), new);
            drop(regs);
            self.store.wake(&register_key(write.name.as_str()));
            Ok(true)
        })
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        Box::pin(async move {
            let mut regs = self.registers();
            let Some(entry) = regs.get_mut(name) else {
                return Ok(None);
            };
            let mut change = Decrement::new(name, by);
            let after = change.over(Some((entry.0.as_slice(), entry.1)))?;
            let written = after.is_some();
            if let Some(after) = after {
                *entry = after;
            }
            drop(regs);
            if written {
                self.store.wake(&register_key(name.as_str()));
            }
            Ok(change.result(written))
        })
    }

    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool> {
        Box::pin(async move {
            let gone = self.registers().remove(name).is_some();
            if gone {
                self.store.wake(&register_key(name.as_str()));
            }
            Ok(gone)
        })
    }

    fn watch_register<'a>(&'a self, _name: &'a LockName) -> Reply<'a, ()> {
        // Every write above wakes every client of the namespace.
        Box::pin(async { Ok(()) })
    }

    fn rate_acquire<'a>(
        &'a self,
        name: &'a LockName,
        cost: RateCost,
    ) -> Reply<'a, Option<std::time::Duration>> {
        Box::pin(async move {
            let now = Instant::now().duration_since(*BORN).as_micros() as u64;
            let mut rates = unpoisoned(&self.store.rates);
            let tat = rates.get(name).copied().unwrap_or(0);
            Ok(match gcra(tat, now, cost) {
                Ok(next) => {
                    rates.insert(name.clone(), next);
                    None
                }
                Err(wait) => Some(wait),
            })
        })
    }
}

impl Backend for MemoryBackend {}

#[cfg(test)]
mod tests {
    use crate::Client;

    /// The store keeps the names in use, not every name ever used, and a
    /// name that comes back still gets a higher token than before.
    #[tokio::test]
    async fn idle_names_are_dropped_and_tokens_still_rise() {
        let ns = format!("shrink-{}", uuid::Uuid::new_v4().simple());
        let c = Client::connect(&format!("memory://{ns}")).await.unwrap();
        let mut last = 0;
        for i in 0..500 {
            let g = c.mutex(&format!("n{i}")).unwrap().acquire().await.unwrap();
            last = last.max(g.fencing_token());
            assert!(g.release().await.unwrap());
        }
        let store = super::SPACES.lock().unwrap().get(&ns).unwrap().clone();
        assert_eq!(
            store.locks.lock().unwrap().names.len(),
            0,
            "idle names kept"
        );
        let g = c.mutex("n0").unwrap().acquire().await.unwrap();
        assert!(g.fencing_token() > last);
        assert!(c.status("n7").await.unwrap().last_token >= last);
    }

    /// A retry whose first answer was lost (the simulation's finding):
    /// the same hold id gets its grant back, not a second hold, and a
    /// fair waiter's place is found, and withdrawn, by its hold id when
    /// the ticket never reached it.
    #[tokio::test]
    async fn retries_and_withdrawals_find_their_grant_and_place_by_hold_id() {
        use crate::spi::{Attempt, Mode, Outcome, Withdrawal};
        let ns = format!("retry-{}", uuid::Uuid::new_v4().simple());
        let wakeups = std::sync::Arc::new(crate::spi::wake::Wakeups::default());
        let b = super::MemoryBackend::open(&ns, wakeups).unwrap();
        let name = crate::LockName::new("l").unwrap();
        let try_ = |hold: &str, owner: &str| Attempt {
            name: name.clone(),
            owner_key: owner.into(),
            hold_id: hold.into(),
            mode: Mode::Exclusive,
            kind: Default::default(),
            lease: std::time::Duration::from_secs(30),
            fair: true,
            will_wait: true,
            until: None,
            ticket: None,
            holder: String::new(),
        };
        let granted = |o| match o {
            Outcome::Granted { token, .. } => token,
            o => panic!("not granted: {o:?}"),
        };
        let first = granted(b.attempt(&try_("h1", "a")).await.unwrap());
        assert_eq!(granted(b.attempt(&try_("h1", "a")).await.unwrap()), first);
        assert_eq!(b.status(&name).await.unwrap().holders.len(), 1);
        // A waiter queues; its retry without the ticket keeps one place.
        assert!(matches!(
            b.attempt(&try_("h2", "b")).await.unwrap(),
            Outcome::Busy(_)
        ));
        assert!(matches!(
            b.attempt(&try_("h2", "b")).await.unwrap(),
            Outcome::Busy(_)
        ));
        assert_eq!(b.status(&name).await.unwrap().waiters, 1);
        let gone = Withdrawal {
            name: name.clone(),
            ticket: None,
            hold_id: "h2".into(),
        };
        b.abandon(&gone).await.unwrap();
        assert_eq!(b.status(&name).await.unwrap().waiters, 0);
    }
}
