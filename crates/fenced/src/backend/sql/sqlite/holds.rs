//! The lock backend: attempts, renewals, releases and status.

use super::*;

impl LockBackend for SqliteBackend {
    fn scheme(&self) -> &'static str {
        "sqlite"
    }

    fn doctor(&self) -> Reply<'_, Vec<crate::doctor::Check>> {
        Box::pin(self.checks())
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        Box::pin(async move {
            let (outcome, changed) = self.attempt_tx(req).await?;
            if changed {
                self.wake_waiters(req.name.as_str()).await;
            }
            Ok(outcome)
        })
    }

    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        Box::pin(async move {
            let now = now_ms();
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
            let mut out = Vec::with_capacity(holds.len());
            for h in holds {
                let r = q(RENEW)
                    .bind(&h.hold_id)
                    .bind(now)
                    .bind(now.saturating_add(ms(h.lease)))
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                out.push(Renewal::from(r.rows_affected() == 1));
            }
            tx.commit().await.map_err(db)?;
            Ok(out)
        })
    }

    fn identity(&self) -> String {
        // The file, whatever path led to it.
        let file = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
        format!("sqlite://{}", file.display())
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> Reply<'a, bool> {
        Box::pin(async move {
            // Whether the release came in time is judged when it was sent.
            let now = now_ms();
            let row = q(RELEASE)
                .bind(&hold.hold_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            let Some(row) = row else { return Ok(false) };
            let expires: i64 = row.try_get(0).map_err(db)?;
            self.wake_waiters(hold.name.as_str()).await;
            // Now and then, for a client that stays open for weeks: the
            // names it no longer uses are forgotten as it goes, in the
            // background (the file may be busy a while).
            if fastrand::u8(..) == 0 {
                let pool = self.pool.clone();
                tokio::spawn(async move {
                    let _ = super::forget_old_tokens(&pool, 256).await;
                });
            }
            Ok(expires > now)
        })
    }

    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()> {
        Box::pin(async move {
            let (name, ticket, hold_id) = (&gone.name, gone.ticket, gone.hold_id.as_str());
            let mut changed = false;
            if let Some(t) = ticket {
                let r = q(DELETE_TICKET)
                    .bind(t)
                    .execute(&self.pool)
                    .await
                    .map_err(db)?;
                changed |= r.rows_affected() > 0;
            }
            let freed = q(RELEASE)
                .bind(hold_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            changed |= freed.is_some();
            // Waiters are woken only when a hold or a queue place went: a
            // storm of dropped acquisitions that never won or queued wakes
            // nobody, where waking on each one sent every waiter of the
            // name back to the file once per drop.
            if changed {
                self.wake_waiters(name.as_str()).await;
            }
            Ok(())
        })
    }

    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        Box::pin(async move {
            let rows: Vec<(String,)> = sqlx::query_as(NAMES)
                .bind(prefix)
                .bind(now_ms())
                .fetch_all(&self.pool)
                .await
                .map_err(db)?;
            Ok(crate::backend::sql::names_of(rows.into_iter().map(|r| r.0)))
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        Box::pin(async move {
            let now = now_ms();
            let mut c = self.pool.acquire().await.map_err(db)?;
            let rows = q(SHOW_HOLDS)
                .bind(name.as_str())
                .fetch_all(&mut *c)
                .await
                .map_err(db)?;
            let mut holders = Vec::new();
            for r in &rows {
                let h = hold_row(r, Some(now)).map_err(db)?;
                holders.extend(h.holder());
            }
            let waiters: i64 = q(COUNT_WAITERS)
                .bind(name.as_str())
                .bind(now)
                .fetch_one(&mut *c)
                .await
                .map_err(db)?
                .try_get(0)
                .map_err(db)?;
            let last: Option<i64> = q(NAME_TOKEN)
                .bind(name.as_str())
                .fetch_optional(&mut *c)
                .await
                .map_err(db)
                .and_then(scalar)?;
            Ok(LockStatus::new(
                holders,
                waiters as usize,
                last.unwrap_or(0) as u64,
            ))
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize> {
        Box::pin(async move {
            let r = q(FORCE_RELEASE)
                .bind(name.as_str())
                .execute(&self.pool)
                .await
                .map_err(db)?;
            self.wake_waiters(name.as_str()).await;
            Ok(r.rows_affected() as usize)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.pool.close().await })
    }
}
