//! The lock backend and registers (kept in the lease tables).

use super::*;

impl LockBackend for MySqlAdvisory {
    fn doctor(&self) -> Reply<'_, Vec<crate::doctor::Check>> {
        Box::pin(self.shared.table.checks(true))
    }

    /// Holds live on the session, not on a lease the server counts: the
    /// core ends one whose lease runs out unrenewed.
    fn ends_holds(&self) -> bool {
        false
    }

    fn scheme(&self) -> &'static str {
        "mysql"
    }

    fn supports_fair(&self) -> bool {
        false
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        Box::pin(self.shared.attempt(req))
    }

    fn renew<'a>(&'a self, refs: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        Box::pin(async move {
            let checks = refs.iter().map(|r| async move {
                let Some(hold) = unpoisoned(&self.shared.holds).get(&r.hold_id).cloned() else {
                    return Renewal::Gone;
                };
                let mine = self.shared.touch(&hold).await;
                Renewal::from(mine)
            });
            Ok(futures_util::future::join_all(checks).await)
        })
    }

    fn request_timeout(&self) -> Duration {
        self.shared.table.request_timeout()
    }

    fn identity(&self) -> String {
        format!("{}?mode=advisory", self.shared.table.identity())
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> Reply<'a, bool> {
        Box::pin(async move {
            self.shared.end(&hold.hold_id).await.ok_or_else(|| {
                Error::unavailable(
                    "MySQL: the session failed under the unlock; closing it freed the lock",
                )
            })
        })
    }

    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()> {
        Box::pin(async move {
            if let Some(t) = gone.ticket {
                self.shared.withdraw(t).await;
            }
            self.shared.end(&gone.hold_id).await;
            Ok(())
        })
    }

    /// The server shows no `GET_LOCK` names without performance_schema:
    /// the names fenced recorded a token for (each then asked `status`).
    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        Box::pin(async move {
            let table = &self.shared.table;
            let mut names = table
                .names_by(crate::backend::sql::mysql::queries::GRANTED_NAMES, prefix)
                .await?;
            // This client's waiting tasks, whose names may have no token yet.
            for p in unpoisoned(&self.shared.probers).values() {
                if p.name.as_str().starts_with(prefix) {
                    names.push(p.name.clone());
                }
            }
            Ok(names)
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        Box::pin(async move {
            let sh = &self.shared;
            let holder = sh.holder_of(name).await?;
            let last_token = sh.table.last_token(name.as_str()).await?;
            let mut holders = Vec::new();
            if let Some(id) = holder {
                // The owner is known for this client's holds; the server
                // records none for other sessions.
                let mut owner = format!("mysql session {id}");
                for h in unpoisoned(&sh.holds).values() {
                    if h.name == *name {
                        owner = h.owner.clone();
                    }
                }
                holders.push(HolderInfo {
                    owner,
                    mode: Mode::Exclusive,
                    // A session lock records no token: the last one issued.
                    token: last_token,
                    // and has no lease on the server while its session lives.
                    lease_left: Duration::MAX,
                    // GET_LOCK keeps nothing beside the lock.
                    holder: None,
                });
            }
            // The server shows no waiters of `GET_LOCK`: this client's own
            // tasks waiting for the name (one prober waits for them all).
            let waiters = sh.table.wakeups().waiting(name.as_str());
            Ok(LockStatus::new(holders, waiters, last_token))
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize> {
        Box::pin(async move {
            let sh = &self.shared;
            let Some(id) = sh.holder_of(name).await? else {
                return Ok(0);
            };
            sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                .execute(sh.table.pool())
                .await
                .map_err(|e| sh.db(e))?;
            Ok(1)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let sh = &self.shared;
            // First the idle sessions, with a goodbye: the close has one
            // request timeout, which the withdrawals may use up.
            sh.close_idle().await;
            let tickets: Vec<Ticket> = unpoisoned(&sh.probers).keys().copied().collect();
            for t in tickets {
                sh.withdraw(t).await;
            }
            let ids: Vec<String> = unpoisoned(&sh.holds).keys().cloned().collect();
            for id in ids {
                sh.end(&id).await;
            }
            sh.close_idle().await;
            sh.table.close().await;
        })
    }
}

impl Store for MySqlAdvisory {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        self.shared.table.register_read(name)
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        self.shared.table.register_write(write)
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        self.shared.table.register_decrement(name, by)
    }

    fn watch_register<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        self.shared.table.watch_register(name)
    }

    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool> {
        self.shared.table.register_delete(name)
    }

    fn rate_acquire<'a>(
        &'a self,
        name: &'a LockName,
        cost: crate::spi::rate::RateCost,
    ) -> Reply<'a, Option<std::time::Duration>> {
        self.shared.table.rate_acquire(name, cost)
    }
}

impl Backend for MySqlAdvisory {}
