//! One try: the one-call grant function, else one transaction.

use super::*;

impl PgBackend {
    /// One attempt, retried when the server aborts it for a conflict.
    pub(super) async fn attempt_inner(&self, req: &Attempt) -> Result<Outcome> {
        // Dropped since we opened: go on without it.
        let gone = |e: &sqlx::Error| has_state(e, &["42883"]);
        let tx = || self.attempt_tx(req);
        let fast =
            crate::backend::sql::call_try_grant(&self.pool, TRY_GRANT, req, ms(req.lease) as f64);
        crate::backend::sql::attempt(&self.fast, req, fast, tx, is_conflict, gone)
            .await
            .map_err(|e| self.db(e))
    }

    pub(super) async fn attempt_tx(
        &self,
        req: &Attempt,
    ) -> std::result::Result<Outcome, sqlx::Error> {
        let name = req.name.as_str();
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await?;
        let c: &mut PgConnection = &mut tx;
        let row = sqlx::query(LOCK_NAME).bind(name).fetch_one(&mut *c).await?;
        let last: i64 = row.try_get("token")?;
        let now_us: i64 = row.try_get("now_us")?;
        let purged = sqlx::query(PURGE).bind(name).fetch_one(&mut *c).await?;
        let mut changed = purged.try_get::<i64, _>("holds")? > 0;
        let rows = sqlx::query(SELECT_HOLDS)
            .bind(name)
            .fetch_all(&mut *c)
            .await?;
        let holds = rows
            .iter()
            .map(|r| hold_row(r, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if let Some(token) = stands(req, &holds) {
            if changed {
                sqlx::query(NOTIFY).bind(name).fetch_one(&mut *c).await?;
            }
            tx.commit().await?;
            return Ok(Outcome::granted(token));
        }
        let (mine, ahead) = if req.fair || req.ticket.is_some() {
            let q = sqlx::query(QUEUE)
                .bind(name)
                .bind(req.ticket.unwrap_or(i64::MAX))
                .fetch_one(&mut *c)
                .await?;
            let mine = q.try_get::<bool, _>("mine")?.then_some(()).and(req.ticket);
            (mine, q.try_get::<bool, _>("ahead")?)
        } else {
            (None, false)
        };
        let outcome = match decide(req, &holds, ahead) {
            Decision::Refuse(why) => Outcome::Refused(why),
            Decision::Grant => {
                let token = (last.saturating_add(1)).max(now_us);
                crate::backend::sql::grant_row(
                    (GRANT, GRANT_ANON),
                    self.holders,
                    req,
                    token,
                    ms(req.lease) as f64,
                )
                .execute(&mut *c)
                .await?;
                if let Some(t) = mine {
                    sqlx::query(DELETE_TICKET).bind(t).execute(&mut *c).await?;
                    // The next fair waiter may go too (readers in a row).
                    changed |= req.fair;
                }
                Outcome::granted(token as u64)
            }
            Decision::Wait { retry_after } => {
                let ttl = ms(QUEUE_TTL) as f64;
                let ticket = match (mine, req.fair && req.will_wait) {
                    (Some(t), _) => {
                        sqlx::query(REFRESH_TICKET)
                            .bind(t)
                            .bind(ttl)
                            .execute(&mut *c)
                            .await?;
                        Some(t)
                    }
                    (None, true) => {
                        let row = sqlx::query(INSERT_WAITER)
                            .bind(name)
                            .bind(req.fair)
                            .bind(ttl)
                            .fetch_one(&mut *c)
                            .await?;
                        Some(row.try_get::<i64, _>("ticket")?)
                    }
                    (None, false) => None,
                };
                Outcome::Busy(Blocked {
                    ticket,
                    retry_after,
                })
            }
        };
        if changed {
            sqlx::query(NOTIFY).bind(name).fetch_one(&mut *c).await?;
        }
        tx.commit().await?;
        Ok(outcome)
    }
}
