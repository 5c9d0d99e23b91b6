//! One try, in one immediate transaction.

use super::*;

impl SqliteBackend {
    pub(super) async fn attempt_tx(&self, req: &Attempt) -> Result<(Outcome, bool)> {
        let now = now_ms();
        let name = req.name.as_str();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
        let c: &mut SqliteConnection = &mut tx;
        let purged = q(PURGE_HOLDS)
            .bind(name)
            .bind(now)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        let mut changed = purged.rows_affected() > 0;
        q(PURGE_WAITERS)
            .bind(name)
            .bind(now)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        let rows = q(SELECT_HOLDS)
            .bind(name)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        let holds = rows
            .iter()
            .map(|r| hold_row(r, Some(now)).map_err(db))
            .collect::<Result<Vec<_>>>()?;
        if let Some(token) = stands(req, &holds) {
            tx.commit().await.map_err(db)?;
            return Ok((Outcome::granted(token), changed));
        }
        let mine: Option<Ticket> = match req.ticket {
            Some(t) => q(MY_TICKET)
                .bind(t)
                .bind(name)
                .fetch_optional(&mut *c)
                .await
                .map_err(db)
                .and_then(scalar)?,
            None => None,
        };
        let queued_ahead = if req.fair {
            let row = q(FAIR_AHEAD)
                .bind(name)
                .bind(mine.unwrap_or(i64::MAX))
                .fetch_one(&mut *c)
                .await
                .map_err(db)?;
            row.try_get::<bool, _>(0).map_err(db)?
        } else {
            false
        };
        let outcome = match decide(req, &holds, queued_ahead) {
            Decision::Refuse(why) => Outcome::Refused(why),
            Decision::Grant => {
                let last: Option<i64> = q(LAST_TOKEN)
                    .bind(name)
                    .fetch_optional(&mut *c)
                    .await
                    .map_err(db)
                    .and_then(scalar)?;
                let token = next_token(last.unwrap_or(0).max(0) as u64);
                let token_i = i64::try_from(token).map_err(|_| {
                    Error::protocol(format!("fencing token of {name:?} overflowed"))
                })?;
                q(SET_TOKEN)
                    .bind(name)
                    .bind(token_i)
                    .execute(&mut *c)
                    .await
                    .map_err(db)?;
                let (take, max) = req.mode.permits();
                q(INSERT_HOLD)
                    .bind(&req.hold_id)
                    .bind(name)
                    .bind(&req.owner_key)
                    .bind(req.mode.code())
                    .bind(i64::from(take))
                    .bind(i64::from(max))
                    .bind(token_i)
                    .bind(now.saturating_add(ms(req.lease)))
                    .bind(&req.holder)
                    .execute(&mut *c)
                    .await
                    .map_err(db)?;
                if let Some(t) = mine {
                    q(DELETE_TICKET)
                        .bind(t)
                        .execute(&mut *c)
                        .await
                        .map_err(db)?;
                    // The next fair waiter may be grantable now (readers in a row).
                    changed |= req.fair;
                }
                Outcome::granted(token)
            }
            Decision::Wait { retry_after } => {
                let expires = now + ms(QUEUE_TTL);
                let ticket = match (mine, req.will_wait) {
                    (Some(t), _) => {
                        q(REFRESH_TICKET)
                            .bind(t)
                            .bind(expires)
                            .execute(&mut *c)
                            .await
                            .map_err(db)?;
                        Some(t)
                    }
                    (None, true) => {
                        let row = q(INSERT_WAITER)
                            .bind(name)
                            .bind(req.fair)
                            .bind(self.wake.addr())
                            .bind(expires)
                            .fetch_one(&mut *c)
                            .await
                            .map_err(db)?;
                        Some(row.try_get(0).map_err(db)?)
                    }
                    (None, false) => None,
                };
                Outcome::Busy(Blocked {
                    ticket,
                    retry_after,
                })
            }
        };
        tx.commit().await.map_err(db)?;
        Ok((outcome, changed))
    }

    /// Wakes the oldest waiter of `name` (and every waiter in this process).
    ///
    /// One wake-up per change, as Curator hands a lock to the next node, not
    /// a herd: the woken waiter, once granted, wakes the next if it can go
    /// too. An address nobody listens on any more is forgotten and the next
    /// oldest is tried.
    pub(super) async fn wake_waiters(&self, name: &str) {
        self.wakeups.wake(name);
        let rows = match q(WAKE_ADDRS)
            .bind(name)
            .bind(now_ms())
            .fetch_all(&self.pool)
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                tracing::debug!(error = %e, "could not list waiters; they will re-check on their own");
                return;
            }
        };
        for row in rows {
            let Ok(addr) = row.try_get::<String, _>(0) else {
                continue;
            };
            if addr == self.wake.addr() || self.wake.send(&addr, name) {
                return;
            }
            let _ = q(FORGET_ADDR).bind(&addr).execute(&self.pool).await;
        }
    }
}
