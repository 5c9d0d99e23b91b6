//! The lock backend and registers (kept in the lease tables).

use super::*;

impl LockBackend for PgAdvisory {
    fn doctor(&self) -> Reply<'_, Vec<crate::doctor::Check>> {
        Box::pin(self.table.checks())
    }

    /// Holds live on the session, not on a lease the server counts: the
    /// core ends one whose lease runs out unrenewed.
    fn ends_holds(&self) -> bool {
        false
    }

    fn scheme(&self) -> &'static str {
        "postgres"
    }

    fn supports_fair(&self) -> bool {
        false
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        Box::pin(self.attempt_inner(req))
    }

    fn renew<'a>(&'a self, refs: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        Box::pin(async move {
            let checks = refs.iter().map(|r| async move {
                let Some(hold) = unpoisoned(&self.holds).get(&r.hold_id).cloned() else {
                    return Renewal::Gone;
                };
                // The session is alive, so the server still holds our lock.
                let alive = touch(&hold, self.idle_timeout).await;
                Renewal::from(alive)
            });
            Ok(futures_util::future::join_all(checks).await)
        })
    }

    fn request_timeout(&self) -> Duration {
        self.table.request_timeout()
    }

    fn identity(&self) -> String {
        format!("{}?mode=advisory", self.table.identity())
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> Reply<'a, bool> {
        Box::pin(async move {
            self.end(&hold.hold_id).await.ok_or_else(|| {
                Error::unavailable(
                    "PostgreSQL: the session failed under the unlock; closing it freed the lock",
                )
            })
        })
    }

    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()> {
        Box::pin(async move {
            self.end(&gone.hold_id).await;
            Ok(())
        })
    }

    /// `pg_locks` shows keys, not names: the names fenced recorded a token
    /// for whose keys are locked now.
    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        Box::pin(async move {
            let pool = self.table.pool();
            let db = |e| self.table.db(e);
            let keys: Vec<(i64, i64)> = sqlx::query_as(KEYS).fetch_all(pool).await.map_err(db)?;
            let keys: std::collections::HashSet<(i64, i64)> = keys.into_iter().collect();
            let rows: Vec<(String,)> =
                sqlx::query_as(crate::backend::sql::postgres::queries::GRANTED_NAMES)
                    .bind(prefix)
                    .fetch_all(pool)
                    .await
                    .map_err(db)?;
            let names = rows
                .into_iter()
                .map(|r| r.0)
                .filter(|n| keys.contains(&halves(key(n))));
            Ok(crate::backend::sql::names_of(names))
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        Box::pin(async move {
            let (hi, lo) = halves(key(name.as_str()));
            let rows = sqlx::query(HOLDERS)
                .bind(hi)
                .bind(lo)
                .fetch_all(self.table.pool())
                .await
                .map_err(|e| self.db(e))?;
            let last_token = self.table.last_token(name.as_str()).await?;
            let mut holders = Vec::new();
            let mut waiters = 0;
            for r in rows {
                if !r.try_get::<bool, _>("granted").map_err(|e| self.db(e))? {
                    waiters += 1;
                    continue;
                }
                let lmode: String = r.try_get("lmode").map_err(|e| self.db(e))?;
                holders.push(HolderInfo {
                    owner: r.try_get("owner").map_err(|e| self.db(e))?,
                    mode: if lmode == "ShareLock" {
                        Mode::Shared
                    } else {
                        Mode::Exclusive
                    },
                    // A session lock records no token: the last one issued.
                    token: last_token,
                    // and has no lease on the server while its session lives.
                    lease_left: Duration::MAX,
                    // An advisory lock keeps nothing beside the lock.
                    holder: None,
                });
            }
            Ok(LockStatus::new(holders, waiters, last_token))
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize> {
        Box::pin(async move {
            let (hi, lo) = halves(key(name.as_str()));
            let row = sqlx::query(TERMINATE)
                .bind(hi)
                .bind(lo)
                .fetch_one(self.table.pool())
                .await
                .map_err(|e| self.db(e))?;
            self.table.wake_waiters(name.as_str()).await;
            Ok(row.try_get::<i64, _>("n").map_err(|e| self.db(e))? as usize)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let ids: Vec<String> = unpoisoned(&self.holds).keys().cloned().collect();
            for id in ids {
                self.end(&id).await;
            }
            self.idle.clear();
            self.table.close().await;
        })
    }
}

impl Store for PgAdvisory {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        self.table.register_read(name)
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        self.table.register_write(write)
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        self.table.register_decrement(name, by)
    }

    fn watch_register<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        self.table.watch_register(name)
    }

    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool> {
        self.table.register_delete(name)
    }

    fn register_add<'a>(&'a self, name: &'a LockName, delta: i64) -> Reply<'a, Option<i64>> {
        self.table.register_add(name, delta)
    }

    fn rate_acquire<'a>(
        &'a self,
        name: &'a LockName,
        cost: crate::spi::rate::RateCost,
    ) -> Reply<'a, Option<std::time::Duration>> {
        self.table.rate_acquire(name, cost)
    }
}

impl Backend for PgAdvisory {}
