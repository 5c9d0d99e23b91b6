//! One try, and the end of a hold.

use super::*;

impl ZkShared {
    pub(super) async fn attempt(self: &Arc<Self>, req: &Attempt) -> Result<Outcome> {
        if req.kind == Kind::Member {
            return self.attempt_member(req).await;
        }
        if let Mode::Permits { take, max } = req.mode {
            return self.attempt_permits(req, take, max).await;
        }
        let dir = Self::path_of(&req.name)?;
        let z = self.client();
        let own = self.own_node(req);
        // An earlier try's create may have gone through with its answer
        // lost (it timed out, or its future was dropped): adopt that node
        // rather than queue a second one behind it.
        if unpoisoned(&own.child).is_none() && own.create_sent.load(Ordering::Acquire) {
            self.adopt_protected(&z, &dir, &own).await?;
        }
        let queued_before = unpoisoned(&own.child).is_some();
        // A mutex waiter queueing behind this client's own waiters (a
        // burst of its tasks on one lock) most likely comes right after
        // one of them: it creates its node alone and, if so, waits on
        // that one without listing the queue. A thousand such waiters
        // otherwise listed up to a thousand nodes each at once, and the
        // server, busy with the answers, fell silent long enough for the
        // client to drop the connection and for its session to go
        // unconfirmed. Not after a create that lost its reply: that node
        // may yet land ahead, and only a listing finds it.
        let behind_own = !queued_before
            && !own.create_sent.load(Ordering::Acquire)
            && req.will_wait
            && req.mode == Mode::Exclusive
            && req.kind == Kind::Lock
            && self.queues_on(&req.name);
        let listed = if !queued_before {
            self.create_and_list(&z, &dir, &own, req, !behind_own)
                .await?
        } else {
            None
        };
        let mine = unpoisoned(&own.child).clone().unwrap_or_default();
        if behind_own
            && !own.create_lost.load(Ordering::Acquire)
            && let Some(before) = self.own_predecessor(&req.name, &mine, &req.owner_key)
        {
            let token = *unpoisoned(&own.czxid);
            return self
                .wait_on(req, &own, &z, &dir, Wait::Key(before.into_bytes()), token)
                .await;
        }
        let children = match listed {
            Some(c) => c,
            None => self.children(&dir).await?,
        };
        let children = self.without_strays(&z, &dir, &req.name, children);
        let q = queue(children);
        let Some(me) = q.iter().position(|(c, _)| *c == mine) else {
            // Our node is gone (the session ended, or it was deleted):
            // never act on a queue we are not in. A stray of its protected
            // id, if its create lost a reply, goes too.
            if own.create_lost.load(Ordering::Acquire) && own.session == self.session() {
                let (me, dir, own) = (self.clone(), dir.clone(), own.clone());
                tokio::spawn(async move {
                    let z = me.client();
                    let _ =
                        tokio::time::timeout(me.timeout, me.delete_strays(&z, &dir, &own)).await;
                });
            }
            unpoisoned(&self.nodes).remove(&req.hold_id);
            return Ok(Outcome::Busy(Blocked {
                ticket: None,
                retry_after: Some(Duration::ZERO),
            }));
        };
        let owners: Vec<Option<String>> =
            q.iter().map(|(c, _)| self.owner_of(&req.name, c)).collect();
        let view: Vec<(&[u8], Mode)> = q.iter().map(|(c, m)| (c.as_bytes(), *m)).collect();
        let wait = waits_for(&view, me, |i| {
            i != me && owners[i].as_deref() == Some(req.owner_key.as_str())
        });
        let token = *unpoisoned(&own.czxid);
        match wait {
            Wait::Granted => {
                if let Some(w) = unpoisoned(&own.watcher).take() {
                    w.abort();
                }
                self.mark_earlier_holds(&own, token);
                unpoisoned(&own.deadline).get_or_insert(Instant::now() + req.lease);
                if queued_before && own.born.elapsed() >= crate::holder::RESTAMP_AFTER {
                    // The node's data was written when it queued: the
                    // holder record gets the grant's time, in the
                    // background, and only over the data it was created
                    // with (version 0). The next waiter, watching this
                    // node, looks once more and waits on.
                    let (z, path, record) =
                        (z.clone(), format!("{dir}/{mine}"), req.holder.clone());
                    let limit = self.timeout;
                    tokio::spawn(async move {
                        let set = z.set_data(&path, record.as_bytes(), Some(0));
                        let _ = tokio::time::timeout(limit, set).await;
                    });
                }
                Ok(Outcome::Granted {
                    token: token as u64,
                    session: Some(self.clock.bound_of(own.session)),
                })
            }
            w => self.wait_on(req, &own, &z, &dir, w, token).await,
        }
    }

    /// The attempt's answer when `own`'s node waits as `w` says: a watch
    /// on what it waits for, which wakes the waiter with `token`.
    async fn wait_on(
        self: &Arc<Self>,
        req: &Attempt,
        own: &OwnNode,
        z: &zk::Client,
        dir: &str,
        w: Wait,
        token: i64,
    ) -> Result<Outcome> {
        if let Some(o) = crate::backend::queue::unwaited(&**self, req, &w).await {
            return Ok(o);
        }
        let wakeups = self.wakeups.clone();
        let name = req.name.clone();
        let task = match w {
            Wait::Key(k) => {
                let path = format!("{dir}/{}", String::from_utf8_lossy(&k));
                match self.watch_gone(z, path, &req.name, token).await? {
                    Some(task) => task,
                    // Gone already: look again at once.
                    None => {
                        return Ok(Outcome::Busy(Blocked {
                            ticket: Some(token),
                            retry_after: Some(Duration::ZERO),
                        }));
                    }
                }
            }
            _ => match z.list_and_watch_children(dir).await {
                Ok((_, watcher)) => tokio::spawn(async move {
                    watcher.changed().await;
                    wakeups.wake_ticket(name.as_str(), token);
                }),
                Err(e) => return Err(self.err(e)),
            },
        };
        if let Some(old) = unpoisoned(&own.watcher).replace(task) {
            old.abort();
        }
        Ok(Outcome::Busy(Blocked {
            ticket: Some(token),
            retry_after: None,
        }))
    }

    /// Watches the node at `path` (the one a waiter waits behind) with
    /// `getData`, and wakes the waiter of `name` with `ticket` once it is
    /// gone; `None` if it is gone already.
    pub(super) async fn watch_gone(
        &self,
        z: &zk::Client,
        path: String,
        name: &LockName,
        ticket: i64,
    ) -> Result<Option<tokio::task::JoinHandle<()>>> {
        let (wakeups, name, z2) = (self.wakeups.clone(), name.clone(), z.clone());
        match z.get_and_watch_data(&path).await {
            Ok((_, _, watcher)) => Ok(Some(tokio::spawn(async move {
                let mut watcher = watcher;
                // The node's data changing (its holder record rewritten at
                // its grant, a leader's proclamation) is no news for us:
                // watch on, unwoken.
                while watcher.changed().await.event_type == zk::EventType::NodeDataChanged {
                    match z2.get_and_watch_data(&path).await {
                        Ok((_, _, w)) => watcher = w,
                        Err(_) => break,
                    }
                }
                wakeups.wake_ticket(name.as_str(), ticket);
            }))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Exclusive holds of this client on `own`'s name granted before it
    /// (lower tokens) learn that a later hold exists, so their releases
    /// do not overwrite its token in the last-token record.
    pub(super) fn mark_earlier_holds(&self, own: &OwnNode, token: i64) {
        for o in unpoisoned(&self.nodes).values() {
            if o.name == own.name
                && o.exclusive
                && unpoisoned(&o.deadline).is_some()
                && *unpoisoned(&o.czxid) < token
            {
                o.later_sibling.store(true, Ordering::Release);
            }
        }
    }

    /// Deletes the node of `hold_id` and forgets it; whether it was still
    /// there. On an error the node is kept, to try again.
    pub(super) async fn end(&self, hold_id: &str) -> Result<bool> {
        let Some(own) = unpoisoned(&self.nodes).get(hold_id).cloned() else {
            return Ok(false);
        };
        // A create that went out without its answer (dropped, timed out,
        // failed oddly) may have made a node: find it by its protected id,
        // or it would head the queue, unnamed, until the session ends.
        if own.semaphore && own.session == self.session() {
            // Its further leases and its place at the gate go first; its
            // lease, the hold, below.
            self.end_semaphore(&own).await?;
        } else if own.member && own.session == self.session() {
            self.adopt_member(&own).await?;
        } else if unpoisoned(&own.child).is_none()
            && own.create_sent.load(Ordering::Acquire)
            && own.session == self.session()
        {
            let dir = Self::path_of(&own.name)?;
            self.adopt_protected(&self.client(), &dir, &own).await?;
        }
        let child = unpoisoned(&own.child).clone();
        let granted = unpoisoned(&own.deadline).is_some();
        let mut was = false;
        if let Some(child) = child
            && own.session == self.session()
        {
            let path = format!("{}/{child}", Self::path_of(&own.name)?);
            let token = *unpoisoned(&own.czxid) as u64;
            let z = self.client();
            let mut recorded = false;
            if granted && own.exclusive && !own.later_sibling.load(Ordering::Acquire) {
                // Exclusive holders of a name release in token order (but
                // for a later hold of this client's own, marked above), so
                // one multi deletes the node and overwrites the record:
                // a release in one round trip. If either op fails (the
                // node is gone, the record is not there yet) nothing is
                // applied and the steps below run one by one.
                let tokens = format!("{TOKENS}/{}", own.name.as_str());
                let record = encode_register(token, b"");
                let mut w = z.new_multi_writer();
                if w.add_delete(&path, None).is_ok()
                    && w.add_set_data(&tokens, &record, None).is_ok()
                {
                    match w.commit().await {
                        Ok(_) => {
                            was = true;
                            recorded = true;
                        }
                        Err(zk::MultiWriteError::OperationFailed { .. }) => {}
                        // The request itself failed: it may have been
                        // applied (a lost reply), so a delete now finding
                        // no node would prove nothing. Let the caller try
                        // again.
                        Err(zk::MultiWriteError::RequestFailed { source }) => {
                            return Err(self.err(source));
                        }
                    }
                }
            }
            if !recorded {
                match z.delete(&path, None).await {
                    Ok(()) => was = true,
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(self.err(e)),
                }
                if was
                    && granted
                    && let Err(e) = self.record_token(&own.name, token).await
                {
                    // The hold is released; only `status`'s last token lags.
                    tracing::warn!(lock = %own.name.as_str(), error = %e, "could not record the last token");
                }
            }
        }
        if own.create_lost.load(Ordering::Acquire)
            && !own.semaphore
            && !own.member
            && own.session == self.session()
        {
            let dir = Self::path_of(&own.name)?;
            self.delete_strays(&self.client(), &dir, &own).await;
        }
        unpoisoned(&self.nodes).remove(hold_id);
        unpoisoned(&own.deadline).take();
        self.wakeups.wake(own.name.as_str());
        Ok(was)
    }

    /// [`end`](Self::end), trying transient errors again for a while.
    pub(super) async fn end_patiently(&self, hold_id: &str, tries: u32) {
        // A session that ends takes its nodes with it; a terminal session
        // error is not transient and stops the retries.
        crate::backend::queue::retry_transient(|| self.end(hold_id), tries, || true).await
    }
}

impl crate::backend::queue::SessionKeys for ZkShared {
    fn end_patiently<'a>(&'a self, hold_id: &'a str, tries: u32) -> BoxFuture<'a, ()> {
        Box::pin(ZkShared::end_patiently(self, hold_id, tries))
    }

    fn tracks(&self, hold_id: &str) -> bool {
        unpoisoned(&self.nodes).contains_key(hold_id)
    }
}
