//! Sessions that hold `GET_LOCK`: taken, kept busy, probed and given back.

use super::*;

impl Shared {
    /// The connection id of the session holding `name`'s `GET_LOCK`, if any.
    pub(super) async fn holder_of(&self, name: &LockName) -> Result<Option<i64>> {
        let row = sqlx::query(HOLDER)
            .bind(key(name.as_str()))
            .fetch_one(self.table.pool())
            .await
            .map_err(|e| self.db(e))?;
        row.try_get("id").map_err(|e| self.db(e))
    }

    pub(super) fn db(&self, e: sqlx::Error) -> Error {
        self.table.db(e)
    }

    /// An idle session, or a new one, whose `wait_timeout` is set for a
    /// hold of `lease` when given: a new session's default (8 hours)
    /// would keep a lock that long if its holder's link went dark before
    /// the set beside the grant's token.
    pub(super) async fn session(&self, lease: Option<Duration>) -> Result<Session> {
        while let Some(s) = self.idle.take() {
            // The server ends a session idle for its `wait_timeout` (a
            // lease and a second, once it held a lock): one idle for half
            // of that is closed, not risked.
            if !s.stale() {
                return Ok(s);
            }
            s.close_quietly();
        }
        let mut conn = MySqlConnection::connect_with(&self.opts)
            .await
            .map_err(|e| self.db(e))?;
        let row = sqlx::query(
            "SELECT CAST(CONNECTION_ID() AS SIGNED) AS id, \
             CAST(@@SESSION.wait_timeout AS SIGNED) AS wait",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(|e| self.db(e))?;
        let id = row.try_get::<i64, _>("id").map_err(|e| self.db(e))?;
        let wait = row.try_get::<i64, _>("wait").map_err(|e| self.db(e))?;
        let mut s = Session {
            conn,
            id,
            wait: Duration::from_secs(wait.max(1) as u64),
            since: Instant::now(),
        };
        if let Some(lease) = lease
            && let Err(e) = self.bound_for(&mut s, lease).await
        {
            s.close().await;
            return Err(e);
        }
        Ok(s)
    }

    /// Keeps a session that holds nothing for the next lock, or closes
    /// it when the idle stack is full.
    pub(super) fn keep_idle(&self, mut s: Session) {
        s.since = Instant::now();
        if let Some(s) = self.idle.keep(s) {
            s.close_quietly();
        }
        self.idle_changed.notify_one();
    }

    /// Closes every idle session, with a goodbye.
    pub(super) async fn close_idle(&self) {
        let all = self.idle.take_where(|_| true);
        futures_util::future::join_all(all.into_iter().map(Session::close)).await;
        self.idle_changed.notify_one();
    }

    /// Sets the session's `wait_timeout` for a hold of `lease` (see
    /// [`wait_for`]), unless it has it already: one statement when a
    /// session first takes a lock, or a lock with another lease.
    async fn bound_for(&self, s: &mut Session, lease: Duration) -> Result<()> {
        let wait = wait_for(lease);
        if s.wait == wait {
            return Ok(());
        }
        // An integer of ours, as text: SET takes no placeholder on every
        // server, and a prepared statement per lease would stay cached.
        let set = format!("SET SESSION wait_timeout = {}", wait.as_secs());
        sqlx::raw_sql(sqlx::AssertSqlSafe(set))
            .execute(&mut s.conn)
            .await
            .map_err(|e| self.db(e))?;
        s.wait = wait;
        Ok(())
    }

    /// Gives the lock back and keeps or closes the session; whether the
    /// session still held the lock.
    /// Whether the lock was still held; `None` if the session failed
    /// (closing it freed the lock, but whether it was held then is unknown).
    pub(super) async fn unlock(&self, mut s: Session, key: &str) -> Option<bool> {
        let was = sqlx::query(UNLOCK)
            .bind(key)
            .fetch_one(&mut s.conn)
            .await
            .and_then(|r| r.try_get::<Option<i64>, _>("was"));
        if let Ok(Some(1)) = was {
            self.keep_idle(s);
            return Some(true);
        }
        // Not ours any more, or the session failed: closing it frees
        // whatever it may still hold.
        let _ = s.conn.close().await;
        was.ok().map(|_| false)
    }

    pub(super) async fn attempt(self: &Arc<Self>, req: &Attempt) -> Result<Outcome> {
        if req.mode != Mode::Exclusive {
            return Err(Error::invalid(
                "mode=advisory on MySQL has mutexes only (GET_LOCK has no shared mode and \
                 counts no permits); use the default lease-table mode for read-write locks \
                 and semaphores",
            ));
        }
        let key = key(req.name.as_str());
        if let Some(t) = req.ticket {
            let prober = unpoisoned(&self.probers).get(&t).cloned();
            if let Some(p) = prober {
                // The one prober of this client's waiters for the lock: if
                // the server says nobody holds it while the prober has
                // waited a while, its session is not waiting in the server
                // (a dead connection no one noticed) and would keep every
                // waiter of this client out. Start over without it.
                let waiting = matches!(*unpoisoned(&p.state), Probe::Waiting);
                let settled = p.since.elapsed() >= Duration::from_secs(1);
                if waiting && (!settled || self.holder_of(&req.name).await?.is_some()) {
                    return Ok(Outcome::Busy(Blocked {
                        ticket: Some(t),
                        retry_after: None,
                    }));
                }
                if waiting {
                    tracing::debug!(lock = %req.name.as_str(), "the prober waits, yet the lock is free: starting over");
                    self.withdraw(t).await;
                }
                let won = {
                    let mut st = unpoisoned(&p.state);
                    match std::mem::replace(&mut *st, Probe::Over) {
                        Probe::Won(s) => Some(s),
                        _ => None,
                    }
                };
                unpoisoned(&self.probers).remove(&t);
                if let Some(mut s) = won {
                    // The session may have waited in the server for longer
                    // than its idle timeout: count its life from a statement
                    // sent now, not from when the wait began.
                    let sent = Instant::now();
                    match sqlx::query("SELECT 1").execute(&mut s.conn).await {
                        Ok(_) => return self.granted(req, s, key, sent).await,
                        Err(e) => {
                            let _ = s.conn.close().await;
                            return Err(self.db(e));
                        }
                    }
                }
                // The prober failed: start over below.
            }
        }
        let mut s = self.session(Some(req.lease)).await?;
        let sent = Instant::now();
        let got = sqlx::query(TRY_LOCK)
            .bind(&key)
            .fetch_one(&mut s.conn)
            .await
            .and_then(|r| r.try_get::<Option<i64>, _>("got"));
        match got {
            Ok(Some(1)) => self.granted(req, s, key, sent).await,
            // One prober per name in a client (see the module's notes):
            // another task's already waits in the server for this lock.
            Ok(Some(_)) if req.will_wait && !self.probed(&key) => {
                // Bounded before it waits: the server may grant it the
                // lock over a link that has gone dark. (Here, not in the
                // prober: a withdrawal stops a wait, not the statement
                // before it.)
                if let Err(e) = self.bound_for(&mut s, req.lease).await {
                    let _ = s.conn.close().await;
                    return Err(e);
                }
                Ok(Outcome::Busy(Blocked {
                    ticket: Some(self.probe(s, key, req.name.clone())),
                    retry_after: None,
                }))
            }
            Ok(Some(_)) => {
                self.keep_idle(s);
                Ok(Outcome::Busy(Blocked {
                    ticket: None,
                    retry_after: None,
                }))
            }
            Ok(None) => {
                let _ = s.conn.close().await;
                Err(Error::protocol(format!(
                    "{}: GET_LOCK({key:?}) answered NULL (an error in the server)",
                    self.table.label()
                )))
            }
            Err(e) => Err(self.db(e)),
        }
    }

    /// Records a hold whose session holds the lock, with a fresh token;
    /// `sent` is when the session last answered before the grant.
    pub(super) async fn granted(
        self: &Arc<Self>,
        req: &Attempt,
        mut s: Session,
        key: String,
        sent: Instant,
    ) -> Result<Outcome> {
        // The session's bound is set beside the token's raise (a prober's
        // session has it already): no round trip of its own. The hold is
        // believed from `sent` plus the bound, and the server counts it
        // from the bound's own statement, which is later.
        let (token, bound) = tokio::join!(
            self.table.next_token(req.name.as_str()),
            self.bound_for(&mut s, req.lease)
        );
        let token = match (token, bound) {
            (Ok(t), Ok(())) => t,
            (Err(e), _) | (_, Err(e)) => {
                self.unlock(s, &key).await;
                return Err(e);
            }
        };
        let wait = s.wait;
        let hold = Arc::new(SessionHold {
            session: tokio::sync::Mutex::new(Some(s)),
            key,
            name: req.name.clone(),
            owner: req.owner_key.clone(),
            ended: Watch::new(false),
            alive: Watch::new(believed_until(sent, wait)),
            wait,
        });
        let bound = hold.alive.subscribe();
        unpoisoned(&self.holds).insert(req.hold_id.clone(), hold.clone());
        let me = self.clone();
        tokio::spawn(async move {
            // Keep the session from the server's idle timeout until the
            // hold ends: a statement a third of it after the last one
            // confirmed, which the renewals (a third of the lease apart,
            // and the timeout is the lease and a second) usually are, so
            // it sends nothing of its own while they run. (A hold whose
            // lease runs out unrenewed is ended by the core, which
            // releases it: no lease timer here.)
            let mut ended = hold.ended.subscribe();
            let mut last = Instant::now();
            loop {
                if ended.get_and_update() {
                    break;
                }
                let due = |last: Instant| {
                    let confirmed = hold.alive.get().checked_sub(hold.wait * 2 / 3);
                    confirmed.unwrap_or(last).max(last + hold.wait / 3)
                };
                tokio::select! {
                    changed = ended.changed() => if changed.is_err() { break },
                    _ = tokio::time::sleep_until(due(last)) => {
                        // A renewal may have confirmed it meanwhile.
                        if Instant::now() >= due(last) {
                            me.touch(&hold).await;
                            last = Instant::now();
                        }
                    }
                }
            }
        });
        Ok(Outcome::Granted {
            token,
            session: Some(bound),
        })
    }

    /// Asks the hold's session whether it still holds the lock (which also
    /// shows the server the session is in use); moves the session's bound
    /// when it answers yes.
    pub(super) async fn touch(&self, hold: &SessionHold) -> bool {
        let mut s = hold.session.lock().await;
        let Some(s) = s.as_mut() else {
            return false;
        };
        let sent = Instant::now();
        let mine = sqlx::query(STILL_MINE)
            .bind(&hold.key)
            .fetch_one(&mut s.conn)
            .await
            .and_then(|row| row.try_get::<i64, _>("mine"))
            .is_ok_and(|m| m == 1);
        if mine {
            hold.alive.send_replace(believed_until(sent, hold.wait));
        }
        mine
    }

    /// Whether a prober of this client waits for `key`, or holds it for
    /// its waiter to adopt.
    fn probed(&self, key: &str) -> bool {
        unpoisoned(&self.probers)
            .values()
            .any(|p| p.key == key && !matches!(*unpoisoned(&p.state), Probe::Over))
    }

    /// Hands a session to a prober that waits in the server; its ticket.
    pub(super) fn probe(self: &Arc<Self>, mut s: Session, key: String, name: LockName) -> Ticket {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let p = Arc::new(Prober {
            conn_id: s.id,
            key: key.clone(),
            name: name.clone(),
            since: Instant::now(),
            state: Mutex::new(Probe::Waiting),
            task: Mutex::new(None),
        });
        unpoisoned(&self.probers).insert(ticket, p.clone());
        let me = self.clone();
        let p2 = p.clone();
        let task = tokio::spawn(async move {
            let p = p2;
            let won = loop {
                let got = sqlx::query(WAIT_LOCK)
                    .bind(&key)
                    .fetch_one(&mut s.conn)
                    .await
                    .and_then(|r| r.try_get::<Option<i64>, _>("got"));
                match got {
                    Ok(Some(1)) => break true,
                    // Waited an hour: wait again, unless withdrawn.
                    Ok(Some(_)) if matches!(*unpoisoned(&p.state), Probe::Waiting) => continue,
                    _ => break false,
                }
            };
            let (withdrawn, failed) = {
                let mut st = unpoisoned(&p.state);
                let waiting = matches!(*st, Probe::Waiting);
                if won && waiting {
                    *st = Probe::Won(s);
                    (None, false)
                } else {
                    *st = Probe::Over;
                    (Some(s), waiting)
                }
            };
            if let Some(s) = withdrawn {
                // Withdrawn (its wait interrupted), or failed. A grant that
                // came just before the withdrawal goes back now, before
                // `withdraw` returns; a failed session is closed.
                if won {
                    me.unlock(s, &key).await;
                } else {
                    let _ = s.conn.close().await;
                }
                // Failed with its waiter still there: the waiter starts
                // over now, not at its next look.
                if failed {
                    me.table.wakeups().wake_ticket(name.as_str(), ticket);
                }
                return;
            }
            // Its own waiter adopts the lock.
            me.table.wakeups().wake_ticket(name.as_str(), ticket);
            // A live waiter adopts the lock within moments; one that went
            // away without withdrawing must not keep it.
            tokio::time::sleep(QUEUE_TTL).await;
            let left = match std::mem::replace(&mut *unpoisoned(&p.state), Probe::Over) {
                Probe::Won(s) => Some(s),
                _ => None,
            };
            if let Some(s) = left {
                unpoisoned(&me.probers).remove(&ticket);
                me.unlock(s, &key).await;
                me.table.wakeups().wake(name.as_str());
            }
        });
        *unpoisoned(&p.task) = Some(task);
        ticket
    }

    /// Withdraws a waiter: interrupts its prober's server-side wait and
    /// returns once the prober's session holds nothing, so a timed-out
    /// acquire leaves no grant behind it.
    pub(super) async fn withdraw(&self, ticket: Ticket) {
        let Some(p) = unpoisoned(&self.probers).remove(&ticket) else {
            return;
        };
        let was = std::mem::replace(&mut *unpoisoned(&p.state), Probe::Over);
        let task = unpoisoned(&p.task).take();
        match was {
            Probe::Won(s) => {
                if let Some(t) = task {
                    t.abort();
                }
                self.unlock(s, &p.key).await;
            }
            Probe::Waiting => {
                // KILL QUERY of one's own user's session needs no privilege.
                let kill = format!("KILL QUERY {}", p.conn_id);
                let _ = sqlx::query(sqlx::AssertSqlSafe(kill))
                    .execute(self.table.pool())
                    .await;
                let Some(mut t) = task else { return };
                if tokio::time::timeout(Duration::from_secs(5), &mut t)
                    .await
                    .is_err()
                {
                    // The server did not answer: end the session itself.
                    t.abort();
                    let kill = format!("KILL {}", p.conn_id);
                    let _ = sqlx::query(sqlx::AssertSqlSafe(kill))
                        .execute(self.table.pool())
                        .await;
                }
            }
            Probe::Over => {}
        }
        // The client's other waiters had no prober of their own: one of
        // them now looks, and waits in the server in its place.
        self.table.wakeups().wake(p.name.as_str());
    }

    /// Ends a hold: unlocks and recycles its session; whether it still held.
    pub(super) async fn end(&self, hold_id: &str) -> Option<bool> {
        let Some(hold) = unpoisoned(&self.holds).remove(hold_id) else {
            return Some(false);
        };
        // Let its session keeper end now.
        hold.ended.send_replace(true);
        let Some(s) = hold.session.lock().await.take() else {
            return Some(false);
        };
        let was = self.unlock(s, &hold.key).await;
        // This client's waiters have no prober while one of its tasks held
        // the lock: one of them looks now.
        self.table.wakeups().wake(hold.name.as_str());
        was
    }
}
