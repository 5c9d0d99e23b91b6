//! The lock backend: attempts, renewals, releases and status.

use super::*;

impl LockBackend for PgBackend {
    fn doctor(&self) -> Reply<'_, Vec<crate::doctor::Check>> {
        Box::pin(self.checks())
    }

    fn scheme(&self) -> &'static str {
        "postgres"
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        Box::pin(self.attempt_inner(req))
    }

    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        Box::pin(async move {
            let ids: Vec<&str> = holds.iter().map(|h| h.hold_id.as_str()).collect();
            let leases: Vec<i64> = holds.iter().map(|h| ms(h.lease)).collect();
            let rows = sqlx::query(RENEW)
                .bind(&ids)
                .bind(&leases)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            let renewed: std::collections::HashSet<String> = rows
                .iter()
                .filter_map(|r| r.try_get::<String, _>(0).ok())
                .collect();
            Ok(holds
                .iter()
                .map(|h| Renewal::from(renewed.contains(&h.hold_id)))
                .collect())
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
            let row = sqlx::query(RELEASE)
                .bind(&hold.hold_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            match row {
                Some(r) => r.try_get::<bool, _>("live").map_err(|e| self.db(e)),
                None => Ok(false),
            }
        })
    }

    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()> {
        Box::pin(async move {
            let (name, ticket, hold_id) = (&gone.name, gone.ticket, gone.hold_id.as_str());
            sqlx::query(ABANDON)
                .bind(name.as_str())
                .bind(ticket.unwrap_or(-1))
                .bind(hold_id)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            Ok(())
        })
    }

    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        Box::pin(async move {
            let rows: Vec<(String,)> = sqlx::query_as(NAMES)
                .bind(prefix)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            Ok(crate::backend::sql::names_of(rows.into_iter().map(|r| r.0)))
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        Box::pin(async move {
            let show = if self.holders {
                SHOW_HOLDS
            } else {
                SELECT_HOLDS
            };
            let rows = sqlx::query(show)
                .bind(name.as_str())
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            let mut holders = Vec::new();
            for r in &rows {
                holders.extend(hold_row(r, None).map_err(|e| self.db(e))?.holder());
            }
            let row = sqlx::query(STATUS_WAITERS)
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
            let row = sqlx::query(FORCE)
                .bind(name.as_str())
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            Ok(row.try_get::<i64, _>("n").map_err(|e| self.db(e))? as usize)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.listener.abort();
            self.pool.close().await;
        })
    }
}
