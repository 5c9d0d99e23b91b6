//! Semaphores in Curator's `InterProcessSemaphoreV2` layout, so that a
//! Curator semaphore and a fenced one on the same path share its permits.
//!
//! Under the semaphore's node `N`:
//! - `N/locks`: a mutex in `InterProcessMutex`'s layout, the **gate**,
//!   that lets one acquirer at a time count;
//! - `N/leases`: one ephemeral-sequential node per permit held.
//!
//! An acquirer takes its place at the gate and waits (on its predecessor)
//! until it is first; then it creates its leases and lists them: it holds
//! once they number no more than the semaphore's permits, else it waits
//! for a lease to go, still first at the gate, so no later acquirer counts
//! before it (FIFO, as Curator's). Holding, it leaves the gate. A
//! hold's token is its lease's `czxid`.
//!
//! fenced names its leases `_c_<uuid>-permit-<take>-<max>-lease-<seq>`:
//! Curator only counts the children, and fenced reads how many permits
//! the semaphore has (a request for another number is refused, as on
//! every backend). A hold of several permits has one lease per permit, as
//! Curator's `acquire(n)` does: the hold's own counts them all (`<take>`),
//! the others, `_c_<uuid>-x<8 hex digits>-permit-0-<max>-lease-<seq>`,
//! count nothing beside it; they are made first, so a hold is never
//! granted short of its leases. A Curator lease (`_c_<uuid>-lease-<seq>`) counts one permit
//! of the asker's number.

use super::*;
use crate::backend::queue::unwaited;

pub(super) const GATE: &str = "locks";
pub(super) const LEASES: &str = "leases";

/// Whether `child` is a lease node of Curator's (`…lease-<sequence>`).
fn is_lease(child: &str) -> bool {
    let digits = child.bytes().rev().take_while(u8::is_ascii_digit).count();
    digits >= 10 && child[..child.len() - digits].ends_with("lease-")
}

/// The leases among `children`, in sequence order, with what each
/// counts: fenced's its take and size; Curator's one permit of `max`.
pub(super) fn leases(children: Vec<String>, max: u32) -> Vec<(String, Mode)> {
    let mut q: Vec<(String, Mode)> = children
        .into_iter()
        .filter_map(|c| {
            let m = match mode_of(&c) {
                Some(m @ Mode::Permits { .. }) => m,
                _ if is_lease(&c) => Mode::Permits { take: 1, max },
                _ => return None,
            };
            Some((c, m))
        })
        .collect();
    q.sort_by_key(|(c, _)| sequence_of(c));
    q
}

/// The size fenced's leases among `q` give the semaphore, if any.
pub(super) fn size_of(children: &[String]) -> Option<u32> {
    children.iter().find_map(|c| match mode_of(c) {
        Some(Mode::Permits { max, .. }) => Some(max),
        _ => None,
    })
}

impl ZkShared {
    /// One try at `take` permits of `max` on `req`'s semaphore.
    pub(super) async fn attempt_permits(
        self: &Arc<Self>,
        req: &Attempt,
        take: u32,
        max: u32,
    ) -> Result<Outcome> {
        let dir = Self::path_of(&req.name)?;
        let (gate_dir, lease_dir) = (format!("{dir}/{GATE}"), format!("{dir}/{LEASES}"));
        let z = self.client();
        let own = self.own_node(req);
        // An earlier try's create may have gone through with its answer
        // lost: adopt that node rather than make a second.
        if unpoisoned(&own.child).is_none() && own.create_sent.load(Ordering::Acquire) {
            self.adopt_leases(&z, &lease_dir, &own).await?;
        }
        let mut listed = None;
        if unpoisoned(&own.child).is_none() {
            if let Some(waiting) = self.at_gate(&z, &gate_dir, &own, req).await? {
                if req.will_wait {
                    return Ok(waiting);
                }
                // A try does not wait for permits, but it waits its turn
                // at the gate while some are free.
                if let Some(busy) = self.try_turn(&z, &dir, &own, req, take, max).await? {
                    return Ok(busy);
                }
            }
            listed = self
                .create_leases(&z, &lease_dir, &own, req, take, max)
                .await?;
        }
        let children = match listed {
            Some(c) => c,
            None => self.children(&lease_dir).await?,
        };
        let q = leases(children, max);
        let mine = unpoisoned(&own.child).clone().unwrap_or_default();
        let mine = mine.strip_prefix(&format!("{LEASES}/")).unwrap_or_default();
        let Some(me) = q.iter().position(|(c, _)| c == mine) else {
            // Our lease is gone (the session ended, or it was deleted):
            // never count a line we are not in. Leave the gate too.
            self.end(&req.hold_id).await?;
            return Ok(Outcome::Busy(Blocked {
                ticket: None,
                retry_after: Some(Duration::ZERO),
            }));
        };
        let view: Vec<(&[u8], Mode)> = q.iter().map(|(c, m)| (c.as_bytes(), *m)).collect();
        // Permits add up whoever holds them: an owner's never nest.
        let wait = waits_for(&view, me, |_| false);
        let token = *unpoisoned(&own.czxid);
        if wait == Wait::Granted {
            // The next acquirer at the gate may count now.
            self.leave_gate(&z, &gate_dir, &own).await?;
            if let Some(w) = unpoisoned(&own.watcher).take() {
                w.abort();
            }
            unpoisoned(&own.deadline).get_or_insert(Instant::now() + req.lease);
            return Ok(Outcome::Granted {
                token: token as u64,
                session: Some(self.clock.bound_of(own.session)),
            });
        }
        if let Some(o) = unwaited(&**self, req, &wait).await {
            return Ok(o);
        }
        // Still first at the gate: wait for a lease to go.
        let (_, watcher) = match z.list_and_watch_children(&lease_dir).await {
            Ok(got) => got,
            Err(e) => return Err(self.err(e)),
        };
        let (wakeups, name) = (self.wakeups.clone(), req.name.clone());
        let task = tokio::spawn(async move {
            watcher.changed().await;
            wakeups.wake_ticket(name.as_str(), token);
        });
        if let Some(old) = unpoisoned(&own.watcher).replace(task) {
            old.abort();
        }
        Ok(Outcome::Busy(Blocked {
            ticket: Some(token),
            retry_after: None,
        }))
    }

    /// Takes (or keeps) `own`'s place at the gate: `None` once it is
    /// first, else how the try ends (waiting on its predecessor, or not
    /// waiting).
    async fn at_gate(
        &self,
        z: &zk::Client,
        gate_dir: &str,
        own: &OwnNode,
        req: &Attempt,
    ) -> Result<Option<Outcome>> {
        // Until it holds, `own`'s czxid is its place's: the ticket it
        // waits with.
        if unpoisoned(&own.gate).is_none()
            && own.gate_sent.load(Ordering::Acquire)
            && let Some((c, czxid)) = self.find_protected(z, gate_dir, &own.protect).await?
        {
            *unpoisoned(&own.czxid) = czxid;
            *unpoisoned(&own.gate) = Some(c);
        }
        let listed = if unpoisoned(&own.gate).is_none() {
            own.gate_sent.store(true, Ordering::Release);
            let name = format!("{}lock-", own.protect);
            let ((child, czxid), listed) = self
                .create_listed(z, gate_dir, &name, req, &own.create_lost, true)
                .await?;
            *unpoisoned(&own.czxid) = czxid;
            *unpoisoned(&own.gate) = Some(child);
            listed
        } else {
            None
        };
        let children = match listed {
            Some(c) => c,
            None => self.children(gate_dir).await?,
        };
        let q = queue(children);
        let mine = unpoisoned(&own.gate).clone().unwrap_or_default();
        let Some(me) = q.iter().position(|(c, _)| *c == mine) else {
            // Gone (the session ended, or someone deleted it): queue anew.
            *unpoisoned(&own.gate) = None;
            own.gate_sent.store(false, Ordering::Release);
            return Ok(Some(Outcome::Busy(Blocked {
                ticket: None,
                retry_after: Some(Duration::ZERO),
            })));
        };
        if me == 0 {
            return Ok(None);
        }
        if !req.will_wait {
            // Not first: the try decides (`try_turn`).
            return Ok(Some(Outcome::Busy(Blocked {
                ticket: None,
                retry_after: None,
            })));
        }
        let ticket = *unpoisoned(&own.czxid);
        let path = format!("{gate_dir}/{}", q[me - 1].0);
        let Some(task) = self.watch_gone(z, path, &req.name, ticket).await? else {
            return Ok(Some(Outcome::Busy(Blocked {
                ticket: Some(ticket),
                retry_after: Some(Duration::ZERO),
            })));
        };
        if let Some(old) = unpoisoned(&own.watcher).replace(task) {
            old.abort();
        }
        Ok(Some(Outcome::Busy(Blocked {
            ticket: Some(ticket),
            retry_after: None,
        })))
    }

    /// A try's turn at the gate, its place taken: it waits (bounded by
    /// half a request timeout) while the leases leave room for it, since
    /// whoever is ahead at the gate is then only counting, not waiting
    /// for permits; `None` once it is first, else busy, its place given
    /// up. A semaphore that is or becomes full answers busy at once.
    async fn try_turn(
        &self,
        z: &zk::Client,
        dir: &str,
        own: &OwnNode,
        req: &Attempt,
        take: u32,
        max: u32,
    ) -> Result<Option<Outcome>> {
        let (gate_dir, lease_dir) = (format!("{dir}/{GATE}"), format!("{dir}/{LEASES}"));
        let until = Instant::now() + self.timeout / 2;
        let busy = Wait::Any;
        while Instant::now() < until {
            // The leases, watched: one made by whoever is ahead may fill
            // the semaphore.
            let (held, made) = match z.list_and_watch_children(&lease_dir).await {
                Ok((c, w)) => (c, Some(w)),
                Err(zk::Error::NoNode) => (Vec::new(), None),
                Err(e) => return Err(self.err(e)),
            };
            let used: u64 = leases(held, max)
                .iter()
                .map(|(_, m)| u64::from(m.permits().0))
                .sum();
            if used + u64::from(take) > u64::from(max) {
                break;
            }
            let q = queue(self.children(&gate_dir).await?);
            let mine = unpoisoned(&own.gate).clone().unwrap_or_default();
            let Some(me) = q.iter().position(|(c, _)| *c == mine) else {
                break;
            };
            if me == 0 {
                return Ok(None);
            }
            let path = format!("{gate_dir}/{}", q[me - 1].0);
            let ahead = match z.get_and_watch_data(&path).await {
                Ok((_, _, w)) => w,
                // Gone: look again.
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(self.err(e)),
            };
            let changed = async move {
                match made {
                    Some(made) => {
                        tokio::select! {
                            _ = ahead.changed() => {}
                            _ = made.changed() => {}
                        }
                    }
                    None => drop(ahead.changed().await),
                }
            };
            if tokio::time::timeout_at(until, changed).await.is_err() {
                break;
            }
        }
        Ok(unwaited(self, req, &busy).await)
    }

    /// Creates `own`'s leases: one more for each further permit it takes
    /// (those an earlier try made, adopted, count), then the hold's own,
    /// last, so that a hold is never granted short of a lease; the leases
    /// listed in the same round trip as the last create (see
    /// `create_listed`), unless it needed another try.
    async fn create_leases(
        &self,
        z: &zk::Client,
        lease_dir: &str,
        own: &OwnNode,
        req: &Attempt,
        take: u32,
        max: u32,
    ) -> Result<Option<Vec<String>>> {
        own.create_sent.store(true, Ordering::Release);
        let have = unpoisoned(&own.extra).len() as u32;
        for _ in have..take.saturating_sub(1) {
            // A name of its own, found again by it alone after a lost reply.
            let name = format!(
                "{}x{:08x}-permit-0-{max}-lease-",
                own.protect,
                fastrand::u32(..)
            );
            let ((child, _), _) = self
                .create_listed(z, lease_dir, &name, req, &own.create_lost, false)
                .await?;
            unpoisoned(&own.extra).push(format!("{LEASES}/{child}"));
        }
        let first = format!("{}{}", own.protect, marker(req.mode, req.kind));
        let ((child, czxid), listed) = self
            .create_listed(z, lease_dir, &first, req, &own.create_lost, true)
            .await?;
        *unpoisoned(&own.czxid) = czxid;
        *unpoisoned(&own.child) = Some(format!("{LEASES}/{child}"));
        Ok(listed)
    }

    /// Finds `own`'s leases after a create whose answer was lost.
    async fn adopt_leases(&self, z: &zk::Client, lease_dir: &str, own: &OwnNode) -> Result<()> {
        let mut extra = Vec::new();
        let children = self.children(lease_dir).await?;
        for c in children.into_iter().filter(|c| c.starts_with(&own.protect)) {
            let main = matches!(mode_of(&c), Some(Mode::Permits { take, .. }) if take > 0);
            if !main {
                extra.push(format!("{LEASES}/{c}"));
                continue;
            }
            if let Some(stat) = z
                .check_stat(&format!("{lease_dir}/{c}"))
                .await
                .map_err(|e| self.err(e))?
            {
                *unpoisoned(&own.czxid) = stat.czxid;
                *unpoisoned(&own.child) = Some(format!("{LEASES}/{c}"));
            }
        }
        *unpoisoned(&own.extra) = extra;
        Ok(())
    }

    /// Deletes `own`'s place at the gate, if it has one.
    async fn leave_gate(&self, z: &zk::Client, gate_dir: &str, own: &OwnNode) -> Result<()> {
        if unpoisoned(&own.gate).is_none() && own.gate_sent.load(Ordering::Acquire) {
            let found = self.find_protected(z, gate_dir, &own.protect).await?;
            *unpoisoned(&own.gate) = found.map(|(c, _)| c);
        }
        let Some(gate) = unpoisoned(&own.gate).clone() else {
            own.gate_sent.store(false, Ordering::Release);
            return Ok(());
        };
        match z.delete(&format!("{gate_dir}/{gate}"), None).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(self.err(e)),
        }
        *unpoisoned(&own.gate) = None;
        own.gate_sent.store(false, Ordering::Release);
        Ok(())
    }

    /// What of `own` a semaphore's end deletes beside its lease: its
    /// further leases and its place at the gate.
    pub(super) async fn end_semaphore(&self, own: &OwnNode) -> Result<()> {
        let dir = Self::path_of(&own.name)?;
        let z = self.client();
        if own.create_sent.load(Ordering::Acquire) && unpoisoned(&own.child).is_none() {
            self.adopt_leases(&z, &format!("{dir}/{LEASES}"), own)
                .await?;
        }
        let extra = unpoisoned(&own.extra).clone();
        for e in extra {
            match z.delete(&format!("{dir}/{e}"), None).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        unpoisoned(&own.extra).clear();
        self.leave_gate(&z, &format!("{dir}/{GATE}"), own).await
    }
}
