//! Registers.

use super::*;
use crate::backend::sql::read_register;
use crate::spi::rate::{RateCost, gcra};
use crate::spi::wake::register_key;
use std::time::Duration;

impl Store for PgBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        let err = |e| self.db(e);
        Box::pin(read_register(&self.pool, REGISTER_READ, name, err))
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        Box::pin(async move {
            let (sql, number) = REGISTER_SQL.for_rule(write.name, write.rule)?;
            let mut query = sqlx::query(sql).bind(write.name.as_str()).bind(write.value);
            if let Some(n) = number {
                query = query.bind(n);
            }
            let r = query.execute(&self.pool).await.map_err(|e| self.db(e))?;
            let written = r.rows_affected() == 1;
            if written {
                self.notify_later(register_key(write.name.as_str()));
            }
            Ok(written)
        })
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        Box::pin(async move {
            let row = sqlx::query(REGISTER_DECREMENT)
                .bind(name.as_str())
                .bind(by)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            let after = row
                .map(|r| r.try_get::<i64, _>("value"))
                .transpose()
                .map_err(|e| self.db(e))?;
            if after.is_some() {
                self.notify_later(register_key(name.as_str()));
            }
            Ok(after)
        })
    }

    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool> {
        Box::pin(async move {
            let r = sqlx::query(REGISTER_DELETE)
                .bind(name.as_str())
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            let gone = r.rows_affected() == 1;
            if gone {
                self.notify_later(register_key(name.as_str()));
            }
            Ok(gone)
        })
    }

    fn watch_register<'a>(&'a self, _name: &'a LockName) -> Reply<'a, ()> {
        // The listener hears every NOTIFY on the channel, writes' too.
        Box::pin(async { Ok(()) })
    }

    fn register_add<'a>(&'a self, name: &'a LockName, delta: i64) -> Reply<'a, Option<i64>> {
        Box::pin(async move {
            let got = sqlx::query_scalar::<_, i64>(REGISTER_ADD)
                .bind(name.as_str())
                .bind(delta)
                .fetch_optional(&self.pool)
                .await;
            match got {
                Ok(None) => Ok(None),
                Ok(Some(n)) => {
                    self.notify_later(register_key(name.as_str()));
                    Ok(Some(n))
                }
                // Not an integer, or out of range: compare-and-set says which.
                Err(e) if has_state(&e, &["22P02", "22003", "22021"]) => Ok(None),
                Err(e) => Err(self.db(e)),
            }
        })
    }

    fn rate_acquire<'a>(
        &'a self,
        name: &'a LockName,
        cost: RateCost,
    ) -> Reply<'a, Option<Duration>> {
        Box::pin(async move {
            let row = match self.rate(name, cost).await {
                // Tables an older fenced made: add the limiters' own.
                Err(e) if has_state(&e, &["42P01"]) => {
                    sqlx::query(RATES_TABLE)
                        .execute(&self.pool)
                        .await
                        .map_err(|e| self.db(e))?;
                    self.rate(name, cost).await
                }
                r => r,
            }
            .map_err(|e| self.db(e))?;
            let get = |c: &str| row.try_get::<Option<i64>, _>(c).map_err(|e| self.db(e));
            if get("granted")?.is_some() {
                return Ok(None);
            }
            let (tat, now) = (get("tat")?.unwrap_or(0), get("now_us")?.unwrap_or(0));
            let wait = gcra(tat.max(0) as u64, now.max(0) as u64, cost).err();
            Ok(Some(wait.unwrap_or_default()))
        })
    }
}

impl PgBackend {
    /// Tells the watchers of a register (wake key `key`) of a write, in
    /// the background: the write is done, and its caller does not wait.
    fn notify_later(&self, key: String) {
        let pool = self.pool.clone();
        tokio::spawn(async move {
            if let Err(e) = sqlx::query(NOTIFY).bind(key).fetch_one(&pool).await {
                tracing::debug!(error = %e, "NOTIFY failed; watchers will look again on their own");
            }
        });
    }

    async fn rate(&self, name: &LockName, cost: RateCost) -> sqlx::Result<sqlx::postgres::PgRow> {
        sqlx::query(RATE)
            .bind(name.as_str())
            .bind(cost.cost_us as i64)
            .bind(cost.tolerance_us as i64)
            .fetch_one(&self.pool)
            .await
    }
}

impl Backend for PgBackend {}
