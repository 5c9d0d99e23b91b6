//! One try: the one-call grant function, else one transaction.

use super::*;

impl MySqlBackend {
    pub(super) async fn attempt_inner(&self, req: &Attempt) -> Result<Outcome> {
        // Dropped since we opened, or made by a role that did not grant us
        // EXECUTE (ER_SP_DOES_NOT_EXIST, ER_PROCACCESS_DENIED_ERROR).
        let gone = |e: &sqlx::Error| matches!(error_number(e), Some(1305 | 1370));
        let tx = || async {
            let (o, changed) = self.attempt_tx(req).await?;
            if changed {
                self.wake_waiters(req.name.as_str()).await;
            }
            Ok(o)
        };
        let fast =
            crate::backend::sql::call_try_grant(&self.pool, TRY_GRANT, req, ms(req.lease), None);
        crate::backend::sql::attempt(&self.fast, req, fast, tx, is_conflict, gone, false)
            .await
            .map_err(|e| self.db(e))
    }

    pub(super) async fn attempt_tx(
        &self,
        req: &Attempt,
    ) -> std::result::Result<(Outcome, bool), sqlx::Error> {
        let name = req.name.as_str();
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let c: &mut MySqlConnection = &mut tx;
        sqlx::query(LOCK_NAME).bind(name).execute(&mut *c).await?;
        let row = sqlx::query(READ_NAME).bind(name).fetch_one(&mut *c).await?;
        let last: i64 = row.try_get("token")?;
        let now_us: i64 = row.try_get("now_us")?;
        let now: i64 = row.try_get("now_ms")?;
        let purged = sqlx::query(PURGE_HOLDS)
            .bind(name)
            .bind(now)
            .execute(&mut *c)
            .await?;
        let mut changed = purged.rows_affected() > 0;
        sqlx::query(PURGE_WAITERS)
            .bind(name)
            .bind(now)
            .execute(&mut *c)
            .await?;
        let rows = sqlx::query(SELECT_HOLDS)
            .bind(name)
            .bind(now)
            .fetch_all(&mut *c)
            .await?;
        let holds = rows
            .iter()
            .map(|r| hold_row(r, Some(now)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if let Some(token) = stands(req, &holds) {
            tx.commit().await?;
            return Ok((Outcome::granted(token), changed));
        }
        let (mine, ahead) = if req.fair || req.ticket.is_some() {
            let t = req.ticket.unwrap_or(i64::MAX);
            let q = sqlx::query(QUEUE)
                .bind(t)
                .bind(name)
                .bind(name)
                .bind(t)
                .fetch_one(&mut *c)
                .await?;
            let mine = (q.try_get::<i64, _>("mine")? == 1)
                .then_some(())
                .and(req.ticket);
            (mine, q.try_get::<i64, _>("ahead")? == 1)
        } else {
            (None, false)
        };
        let outcome = match decide(req, &holds, ahead) {
            Decision::Refuse(why) => Outcome::Refused(why),
            Decision::Grant => {
                let token = last.saturating_add(1).max(now_us);
                sqlx::query(SET_TOKEN)
                    .bind(token)
                    .bind(name)
                    .execute(&mut *c)
                    .await?;
                crate::backend::sql::grant_row(
                    (INSERT_HOLD, INSERT_HOLD_ANON),
                    self.holders,
                    req,
                    token,
                    now.saturating_add(ms(req.lease)),
                )
                .execute(&mut *c)
                .await?;
                if let Some(t) = mine {
                    sqlx::query(DELETE_TICKET).bind(t).execute(&mut *c).await?;
                    changed |= req.fair;
                }
                Outcome::granted(token as u64)
            }
            Decision::Wait { retry_after } => {
                let expires = now + ms(QUEUE_TTL);
                let bell = self.bell.load(Ordering::Acquire);
                let ticket = match (mine, req.will_wait) {
                    (Some(t), _) => {
                        sqlx::query(REFRESH_TICKET)
                            .bind(expires)
                            .bind(bell)
                            .bind(t)
                            .execute(&mut *c)
                            .await?;
                        Some(t)
                    }
                    (None, true) => {
                        let r = sqlx::query(INSERT_WAITER)
                            .bind(name)
                            .bind(i8::from(req.fair))
                            .bind(bell)
                            .bind(expires)
                            .execute(&mut *c)
                            .await?;
                        Some(r.last_insert_id() as i64)
                    }
                    (None, false) => None,
                };
                Outcome::Busy(Blocked {
                    ticket,
                    retry_after,
                })
            }
        };
        tx.commit().await?;
        Ok((outcome, changed))
    }

    /// Wakes the oldest waiter of `name` (and this client's own waiters).
    pub(super) async fn wake_waiters(&self, name: &str) {
        self.wakeups.wake(name);
        let rows = match sqlx::query(BELLS).bind(name).fetch_all(&self.pool).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::debug!(error = %e, "could not list waiters; they will look again on their own");
                return;
            }
        };
        let mine = self.bell.load(Ordering::Acquire);
        for row in rows {
            let Ok(bell) = row.try_get::<i64, _>("bell") else {
                continue;
            };
            if bell == mine {
                return;
            }
            if bell > 0 {
                let kill = format!("KILL QUERY {bell}");
                if sqlx::query(sqlx::AssertSqlSafe(kill))
                    .execute(&self.pool)
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            // Nobody answers there any more: forget those waiters.
            let _ = sqlx::query(FORGET_BELL)
                .bind(bell)
                .execute(&self.pool)
                .await;
        }
    }
}
