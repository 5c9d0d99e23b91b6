//! The lock backend: attempts, renewals, releases and status.

use super::*;

impl LockBackend for MySqlBackend {
    fn doctor(&self) -> Reply<'_, Vec<crate::doctor::Check>> {
        Box::pin(self.checks(false))
    }

    fn scheme(&self) -> &'static str {
        "mysql"
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        Box::pin(self.attempt_inner(req))
    }

    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(holds.len());
            // One statement per lease length (usually one), each over a
            // batch of ids; then which of them are live.
            for chunk in holds.chunks(500) {
                let marks = vec!["?"; chunk.len()].join(", ");
                let mut leases: Vec<i64> = chunk.iter().map(|h| ms(h.lease)).collect();
                leases.sort_unstable();
                leases.dedup();
                for lease in leases {
                    let ids: Vec<&str> = chunk
                        .iter()
                        .filter(|h| ms(h.lease) == lease)
                        .map(|h| h.hold_id.as_str())
                        .collect();
                    let sql = format!(
                        "UPDATE fenced_holds SET expires_ms = {NOW_MS} + ? \
                         WHERE expires_ms > {NOW_MS} AND hold_id IN ({})",
                        vec!["?"; ids.len()].join(", ")
                    );
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(lease);
                    for id in ids {
                        q = q.bind(id);
                    }
                    q.execute(&self.pool).await.map_err(|e| self.db(e))?;
                }
                let sql = format!(
                    "SELECT hold_id FROM fenced_holds WHERE expires_ms > {NOW_MS} \
                     AND hold_id IN ({marks})"
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for h in chunk {
                    q = q.bind(h.hold_id.as_str());
                }
                let rows = q.fetch_all(&self.pool).await.map_err(|e| self.db(e))?;
                let live: std::collections::HashSet<String> = rows
                    .iter()
                    .filter_map(|r| r.try_get::<String, _>("hold_id").ok())
                    .collect();
                out.extend(
                    chunk
                        .iter()
                        .map(|h| Renewal::from(live.contains(&h.hold_id))),
                );
            }
            Ok(out)
        })
    }

    fn request_timeout(&self) -> Duration {
        self.timeout
    }

    fn identity(&self) -> String {
        self.identity.clone()
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> Reply<'a, bool> {
        Box::pin(async move {
            // Read the whole reply: MariaDB sends a RETURNING row before the
            // statement has finished, and a deadlock after it rolls the
            // delete back. fetch_optional would stop at the row and report
            // a release that did not happen (the error then surfaced only
            // when the pool tested the connection).
            let mut tries = 0;
            let rows = loop {
                match sqlx::query(RELEASE)
                    .bind(&hold.hold_id)
                    .fetch_all(&self.pool)
                    .await
                {
                    Err(e) if is_conflict(&e) && tries < 10 => tries += 1,
                    r => break r.map_err(|e| self.db(e))?,
                }
            };
            let Some(row) = rows.into_iter().next() else {
                return Ok(false);
            };
            self.wake_waiters(hold.name.as_str()).await;
            Ok(row.try_get::<i64, _>("live").map_err(|e| self.db(e))? == 1)
        })
    }

    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()> {
        Box::pin(async move {
            let (name, ticket, hold_id) = (&gone.name, gone.ticket, gone.hold_id.as_str());
            let mut changed = false;
            if let Some(t) = ticket {
                let r = sqlx::query(ABANDON_TICKET)
                    .bind(t)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.db(e))?;
                changed |= r.rows_affected() > 0;
            }
            let r = sqlx::query(ABANDON_HOLD)
                .bind(hold_id)
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            changed |= r.rows_affected() > 0;
            if changed {
                self.wake_waiters(name.as_str()).await;
            }
            Ok(())
        })
    }

    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        Box::pin(async move { self.names_by(NAMES, prefix).await })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        Box::pin(async move {
            let show = if self.holders {
                SHOW_HOLDS
            } else {
                STATUS_HOLDS
            };
            let rows = sqlx::query(show)
                .bind(name.as_str())
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            let mut holders = Vec::new();
            for r in &rows {
                let now: i64 = r.try_get("now_ms").map_err(|e| self.db(e))?;
                let h = hold_row(r, Some(now)).map_err(|e| self.db(e))?;
                holders.extend(h.holder());
            }
            let row = sqlx::query(STATUS_REST)
                .bind(name.as_str())
                .bind(name.as_str())
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            let (waiters, last_token) = waiters_and_token(&row).map_err(|e| self.db(e))?;
            Ok(LockStatus::new(holders, waiters, last_token))
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize> {
        Box::pin(async move {
            let r = sqlx::query(FORCE)
                .bind(name.as_str())
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            self.wake_waiters(name.as_str()).await;
            Ok(r.rows_affected() as usize)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(d) = &*self.doorbell.lock().await {
                d.abort();
            }
            self.pool.close().await;
        })
    }
}
