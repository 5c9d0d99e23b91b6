//! Registers.

use super::*;
use crate::backend::sql::read_register;
use crate::spi::rate::{RateCost, gcra};
use crate::spi::wake::register_key;

impl Store for SqliteBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        Box::pin(read_register(&self.pool, REGISTER_READ, name, db))
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        Box::pin(async move {
            let (sql, number) = REGISTER_SQL.for_rule(write.name, write.rule)?;
            let mut query = q(sql).bind(write.name.as_str()).bind(write.value);
            if let Some(n) = number {
                query = query.bind(n);
            }
            let r = query.execute(&self.pool).await.map_err(db)?;
            let written = r.rows_affected() == 1;
            if written {
                self.ring_watchers(write.name).await;
            }
            Ok(written)
        })
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        Box::pin(async move {
            let row = q(REGISTER_DECREMENT)
                .bind(name.as_str())
                .bind(by)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            let after = scalar(row)?;
            if after.is_some() {
                self.ring_watchers(name).await;
            }
            Ok(after)
        })
    }

    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool> {
        Box::pin(async move {
            let r = q(REGISTER_DELETE)
                .bind(name.as_str())
                .execute(&self.pool)
                .await
                .map_err(db)?;
            let gone = r.rows_affected() == 1;
            if gone {
                self.ring_watchers(name).await;
            }
            Ok(gone)
        })
    }

    fn watch_register<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        Box::pin(async move {
            let key = register_key(name.as_str());
            self.watching
                .refresh(&key, self.refresh_watcher(&key))
                .await
        })
    }

    fn rate_acquire<'a>(
        &'a self,
        name: &'a LockName,
        cost: RateCost,
    ) -> Reply<'a, Option<Duration>> {
        Box::pin(self.rate(name, cost))
    }
}

impl SqliteBackend {
    /// Keeps this process's watcher row of register key `key` alive for
    /// [`QUEUE_TTL`] more, making it if there is none (and dropping every
    /// lapsed watcher row then, so that rows of names no longer watched
    /// do not pile up).
    async fn refresh_watcher(&self, key: &str) -> Result<()> {
        let now = now_ms();
        let expires = now + QUEUE_TTL.as_millis() as i64;
        let addr = self.wake.addr();
        let r = q(REFRESH_WATCHER)
            .bind(key)
            .bind(addr)
            .bind(expires)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        if r.rows_affected() == 0 {
            q(PURGE_WATCHERS)
                .bind(now)
                .execute(&self.pool)
                .await
                .map_err(db)?;
            q(INSERT_WAITER)
                .bind(key)
                .bind(false)
                .bind(addr)
                .bind(expires)
                .execute(&self.pool)
                .await
                .map_err(db)?;
        }
        Ok(())
    }

    /// A rate limiter's decision by the host's clock, the clock of the
    /// file's every client.
    async fn rate(&self, name: &LockName, cost: RateCost) -> Result<Option<Duration>> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        let granted = q(RATE)
            .bind(name.as_str())
            .bind(now)
            .bind(cost.cost_us as i64)
            .bind(cost.tolerance_us as i64)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        if granted.is_some() {
            return Ok(None);
        }
        let tat: Option<i64> = sqlx::query_scalar(RATE_TAT)
            .bind(name.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        // Refused: how long from the state now (another client may have
        // moved it since; at worst the caller asks again at once).
        let wait = gcra(tat.unwrap_or(0).max(0) as u64, now.max(0) as u64, cost).err();
        Ok(Some(wait.unwrap_or_default()))
    }

    /// Tells every process watching register `name` (this one too) that
    /// it changed, in the background: the write is done, and its caller
    /// does not wait for the watchers. Best effort: a watcher not told
    /// looks again on its own.
    async fn ring_watchers(&self, name: &LockName) {
        let key = register_key(name.as_str());
        self.wakeups.wake(&key);
        let (pool, wake) = (self.pool.clone(), self.wake.clone());
        tokio::spawn(async move {
            let rows: Vec<(String,)> = match sqlx::query_as(WATCHER_ADDRS)
                .bind(&key)
                .bind(now_ms())
                .fetch_all(&pool)
                .await
            {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::debug!(error = %e, "could not list register watchers; they will look again on their own");
                    return;
                }
            };
            for (addr,) in rows {
                if addr != wake.addr() && !wake.send(&addr, &key) {
                    let _ = q(FORGET_ADDR).bind(&addr).execute(&pool).await;
                }
            }
        });
    }
}

impl Backend for SqliteBackend {}
