//! One try, and the end of a hold.

use super::*;

impl EtcdShared {
    pub(super) fn err(&self, e: etcd_client::Error) -> Error {
        map_err(&self.label, e)
    }

    pub(super) fn lease(&self) -> Result<i64> {
        match self.session.lease.load(Ordering::Acquire) {
            0 => Err(Error::unavailable(format!(
                "etcd at {}: this client's session lease is gone and no new one is granted yet",
                self.label
            ))),
            id => Ok(id),
        }
    }

    /// This client's key for an attempt, made on its first try.
    pub(super) fn own_key(&self, req: &Attempt, prefix: &[u8], lease: i64) -> Arc<OwnKey> {
        let mut keys = unpoisoned(&self.keys);
        if let Some(k) = keys.get(&req.hold_id)
            && k.lease == lease
        {
            return k.clone();
        }
        let base = format!("{}{lease:x}", String::from_utf8_lossy(prefix));
        let ghosts = unpoisoned(&self.ghosts);
        let taken =
            |k: &str| keys.values().any(|o| o.key == k.as_bytes()) || ghosts.contains(k.as_bytes());
        let key = if taken(&base) {
            loop {
                let n = self.next_suffix.fetch_add(1, Ordering::Relaxed);
                let k = format!("{base}_{n}");
                if !taken(&k) {
                    break k;
                }
            }
        } else {
            base
        };
        let own = Arc::new(OwnKey {
            key: key.into_bytes(),
            name: req.name.clone(),
            owner: req.owner_key.clone(),
            lease,
            rev: AtomicI64::new(0),
            deadline: Mutex::new(None),
            watcher: Mutex::new(None),
            freed: Arc::new(AtomicBool::new(false)),
            born: Instant::now(),
        });
        keys.insert(req.hold_id.clone(), own.clone());
        own
    }

    /// Which keys of a prefix listing (sorted by create revision) hold.
    pub(super) fn grants(&self, kvs: &[KeyValue]) -> Vec<bool> {
        let owners: Vec<Option<String>> = kvs.iter().map(|kv| self.owner_of(kv.key())).collect();
        grants(&queue(kvs), &owners)
    }

    pub(super) fn owner_of(&self, key: &[u8]) -> Option<String> {
        unpoisoned(&self.keys)
            .values()
            .find(|o| o.key == key)
            .map(|o| o.owner.clone())
    }

    /// A waiter's key was written when it queued: its holder record gets
    /// the grant's time, in the background (waiters watch deletes only,
    /// so nobody wakes for it). Only while the key is the one granted and
    /// unwritten since: never over a leader's proclaimed value, never
    /// bringing back a key released meanwhile.
    fn stamp_grant(&self, own: &OwnKey, rev: i64, req: &Attempt) {
        let txn = Txn::new()
            .when([
                Compare::create_revision(own.key.clone(), CompareOp::Equal, rev),
                Compare::mod_revision(own.key.clone(), CompareOp::Equal, rev),
            ])
            .and_then([TxnOp::put(
                own.key.clone(),
                value_of(req.mode, &req.holder),
                Some(PutOptions::new().with_lease(own.lease)),
            )]);
        let mut etcd = self.etcd.clone();
        tokio::spawn(async move {
            // Bounded by the client's request timeout; a failure leaves the
            // queueing time, which is all it costs.
            let _ = etcd.txn(txn).await;
        });
    }

    /// The grant of `own`, made at `rev`.
    fn granted(&self, own: &OwnKey, rev: i64, req: &Attempt, created: bool) -> Outcome {
        if let Some(w) = unpoisoned(&own.watcher).take() {
            w.abort();
        }
        unpoisoned(&own.deadline).get_or_insert(Instant::now() + req.lease);
        if !created && own.born.elapsed() >= crate::holder::RESTAMP_AFTER {
            self.stamp_grant(own, rev, req);
        }
        Outcome::Granted {
            token: rev as u64,
            session: Some(self.session.clock.bound_of(own.lease)),
        }
    }

    pub(super) async fn attempt(self: &Arc<Self>, req: &Attempt) -> Result<Outcome> {
        let prefix = prefix_of(&req.name)?;
        let lease = self.lease()?;
        let own = self.own_key(req, &prefix, lease);
        let rev = own.rev.load(Ordering::Acquire);
        if rev > 0 && own.freed.load(Ordering::Acquire) {
            // The only key ahead of ours is gone (its delete reached our
            // watch) and later keys queue behind: ours is first, as a
            // listing would say one round trip later. Our key lives as
            // long as our session lease, which bounds the hold as it would
            // after a listing.
            return Ok(self.granted(&own, rev, req, false));
        }
        let mut etcd = self.etcd.clone();
        // A waiter's key exists already: a read-only transaction looks at
        // the queue without a write through consensus (etcd sends a
        // transaction through Raft if either branch writes, taken or not).
        let known = rev > 0;
        let txn = if known {
            Txn::new().and_then([queue_get(&prefix)])
        } else {
            Txn::new()
                .when([Compare::create_revision(
                    own.key.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([
                    TxnOp::put(
                        own.key.clone(),
                        value_of(req.mode, &req.holder),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    queue_get(&prefix),
                ])
                .or_else([queue_get(&prefix)])
        };
        let r = match etcd.txn(txn).await {
            Ok(r) => r,
            Err(e) => {
                // The server let our session lease run out before the
                // keep-alive noticed: start a new session, then try again.
                if lease_gone(&e) {
                    drop_session(self, lease);
                }
                return Err(self.err(e));
            }
        };
        let created = !known && r.succeeded();
        let at = revision(&r);
        let kvs = own_level(&prefix, gets(&r).pop().unwrap_or_default());
        let Some(me) = kvs.iter().position(|kv| kv.key() == own.key.as_slice()) else {
            // Our key is gone (our session ended while we waited, or it
            // was force-deleted): never act on a queue we are not in.
            unpoisoned(&self.keys).remove(&req.hold_id);
            if created {
                return Err(Error::protocol(format!(
                    "etcd at {}: a key we just created is missing from its prefix",
                    self.label
                )));
            }
            return Ok(Outcome::Busy(Blocked {
                ticket: None,
                retry_after: Some(Duration::ZERO),
            }));
        };
        let rev = kvs[me].create_revision();
        own.rev.store(rev, Ordering::Release);
        let owners: Vec<Option<String>> = kvs.iter().map(|kv| self.owner_of(kv.key())).collect();
        let wait = waits_for(&queue(&kvs), me, |i| {
            i != me && owners[i].as_deref() == Some(req.owner_key.as_str())
        });
        match wait {
            Wait::Granted => Ok(self.granted(&own, rev, req, created)),
            w => {
                if let Some(o) = crate::backend::queue::unwaited(&**self, req, &w).await {
                    return Ok(o);
                }
                // The watch wakes us at the delete of the key we wait on
                // (or of any key of the queue). Waiting on the one key
                // ahead, it covers our own key too: the delete of the key
                // ahead then grants by itself, unless ours went first (by
                // hand, or with our session), which a listing will say.
                let sole = me == 1;
                let (key, options, ahead_key) = match w {
                    Wait::Key(k) if sole => {
                        let (lo, mut end) = if k < own.key {
                            (k.clone(), own.key.clone())
                        } else {
                            (own.key.clone(), k.clone())
                        };
                        end.push(0);
                        (lo, WatchOptions::new().with_range(end), Some(k))
                    }
                    Wait::Key(k) => (k, WatchOptions::new(), None),
                    _ => (prefix.clone(), WatchOptions::new().with_prefix(), None),
                };
                let options = options
                    .with_start_revision(at + 1)
                    .with_filters([WatchFilterType::NoPut]);
                let wakeups = self.wakeups.clone();
                let name = req.name.clone();
                let mut etcd = self.etcd.clone();
                let (freed, own_key) = (own.freed.clone(), own.key.clone());
                let task = tokio::spawn(async move {
                    if let Ok(mut stream) = etcd.watch(key, Some(options)).await {
                        while let Ok(Some(msg)) = stream.message().await {
                            if msg.canceled() {
                                break;
                            }
                            let gone = |k: &[u8]| {
                                msg.events().iter().any(|e| {
                                    e.event_type() == EventType::Delete
                                        && e.kv().is_some_and(|kv| kv.key() == k)
                                })
                            };
                            match &ahead_key {
                                Some(_) if gone(&own_key) => break,
                                Some(k) if gone(k) => {
                                    freed.store(true, Ordering::Release);
                                    break;
                                }
                                // Another key between the two: not ours to hear.
                                Some(_) => {}
                                None if msg
                                    .events()
                                    .iter()
                                    .any(|e| e.event_type() == EventType::Delete) =>
                                {
                                    break;
                                }
                                None => {}
                            }
                        }
                    }
                    // This waiter's own watch: it alone looks again.
                    wakeups.wake_ticket(name.as_str(), rev);
                });
                if let Some(old) = unpoisoned(&own.watcher).replace(task) {
                    old.abort();
                }
                Ok(Outcome::Busy(Blocked {
                    ticket: Some(rev),
                    retry_after: None,
                }))
            }
        }
    }

    /// Deletes the key of `hold_id` (hold or place) and forgets it; whether
    /// the key was still there. On an error the key is kept, to try again.
    pub(super) async fn end(&self, hold_id: &str) -> Result<bool> {
        let Some(own) = unpoisoned(&self.keys).get(hold_id).cloned() else {
            return Ok(false);
        };
        let rev = own.rev.load(Ordering::Acquire);
        let granted = unpoisoned(&own.deadline).is_some();
        let mut ops = vec![TxnOp::delete(own.key.clone(), None)];
        if granted {
            ops.push(record_token(&own.name, rev));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                own.key.clone(),
                if rev > 0 {
                    CompareOp::Equal
                } else {
                    CompareOp::Greater
                },
                rev,
            )])
            .and_then(ops);
        let mut etcd = self.etcd.clone();
        let done = etcd.txn(txn).await.map_err(|e| self.err(e))?.succeeded();
        if rev == 0 && !done {
            self.haunt(own.key.clone());
        }
        unpoisoned(&self.keys).remove(hold_id);
        unpoisoned(&own.deadline).take();
        self.wakeups.wake(own.name.as_str());
        Ok(done)
    }

    /// Watches for a key whose create was given up unanswered: the put
    /// may still be applied (a proposal the cluster commits after the
    /// request timed out), and would then sit in its lock's queue on our
    /// live session, unknown to us, until the client closes. Looked for
    /// after 1, 3, 9 and 27 request timeouts and deleted if there; the
    /// name is not reused meanwhile, so what is found is the ghost.
    pub(super) fn haunt(&self, key: Vec<u8>) {
        unpoisoned(&self.ghosts).insert(key.clone());
        let (ghosts, mut etcd, timeout) = (self.ghosts.clone(), self.etcd.clone(), self.timeout);
        tokio::spawn(async move {
            let mut wait = timeout;
            for _ in 0..4 {
                tokio::time::sleep(wait).await;
                let delete = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Greater, 0)])
                    .and_then([TxnOp::delete(key.clone(), None)]);
                if let Ok(r) = etcd.txn(delete).await
                    && r.succeeded()
                {
                    tracing::warn!(key = %String::from_utf8_lossy(&key),
                        "etcd applied a create after it was given up; deleted it");
                }
                wait *= 3;
            }
            unpoisoned(&ghosts).remove(&key);
        });
    }

    /// [`end`](Self::end) in the background's way: transient errors are
    /// tried again for a while (a leader election), then left to the
    /// session lease.
    pub(super) async fn end_patiently(&self, hold_id: &str, tries: u32) {
        let epoch = self.session.epoch.load(Ordering::Acquire);
        let same_session = || self.session.epoch.load(Ordering::Acquire) == epoch;
        crate::backend::queue::retry_transient(|| self.end(hold_id), tries, same_session).await
    }
}

impl crate::backend::queue::SessionKeys for EtcdShared {
    fn end_patiently<'a>(&'a self, hold_id: &'a str, tries: u32) -> BoxFuture<'a, ()> {
        Box::pin(EtcdShared::end_patiently(self, hold_id, tries))
    }

    fn tracks(&self, hold_id: &str) -> bool {
        unpoisoned(&self.keys).contains_key(hold_id)
    }
}
