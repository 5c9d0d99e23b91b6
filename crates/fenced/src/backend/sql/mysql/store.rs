//! Registers.

use super::*;
use crate::backend::sql::read_register;
use crate::spi::rate::{RateCost, gcra};
use crate::spi::wake::register_key;

impl Store for MySqlBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        let err = |e| self.db(e);
        Box::pin(read_register(&self.pool, REGISTER_READ, name, err))
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        Box::pin(async move {
            let written = self.write_register(write).await?;
            if written {
                self.ring_watchers(write.name).await;
            }
            Ok(written)
        })
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        Box::pin(async move {
            let mut tx = self.pool.begin().await.map_err(|e| self.db(e))?;
            let row = sqlx::query(REGISTER_LOCK)
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| self.db(e))?;
            let Some(row) = row else {
                return Ok(None);
            };
            let v: Vec<u8> = row.try_get("value").map_err(|e| self.db(e))?;
            let f: i64 = row.try_get("fence").map_err(|e| self.db(e))?;
            let n = crate::spi::codec::parse_i64(name, &v)?;
            if n < by {
                return Ok(None);
            }
            sqlx::query(REGISTER_UPSERT)
                .bind(name.as_str())
                .bind((n - by).to_string().into_bytes())
                .bind(f)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.db(e))?;
            tx.commit().await.map_err(|e| self.db(e))?;
            self.ring_watchers(name).await;
            Ok(Some(n - by))
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
                self.ring_watchers(name).await;
            }
            Ok(gone)
        })
    }

    fn watch_register<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        Box::pin(async move {
            // Known by its whole wake key; its row's name may be cut short.
            let id = register_key(name.as_str());
            let row = watcher_row(name);
            self.watching.refresh(&id, self.refresh_watcher(&row)).await
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

impl Backend for MySqlBackend {}

/// The name of a client's watcher row of register `name`: its wake key
/// (the name behind the byte 0x01), cut to the 512 bytes of the column.
/// Names that share their first 511 bytes share a row name, and so only
/// wake each other's watchers for nothing: the doorbell wakes every
/// waiter of a client, who each look at their own register.
fn watcher_row(name: &LockName) -> Vec<u8> {
    let mut key = register_key(name.as_str()).into_bytes();
    key.truncate(crate::MAX_NAME_LEN);
    key
}

impl MySqlBackend {
    /// A rate limiter's decision by the server's clock: the row locked,
    /// the rule applied, the row written, in one transaction. The first
    /// decision of a name inserts its row; of two that race to, the
    /// loser (a duplicate key, or InnoDB's deadlock on the gap) tries
    /// again.
    async fn rate(&self, name: &LockName, cost: RateCost) -> Result<Option<Duration>> {
        const TRIES: usize = 3;
        let mut tries = 1;
        loop {
            match self.rate_once(name, cost).await {
                // The first limiter of this database: make its table.
                Err(e)
                    if tries < TRIES
                        && e.as_database_error().and_then(|d| d.code()).as_deref()
                            == Some("42S02") =>
                {
                    sqlx::query(RATES_TABLE)
                        .execute(&self.pool)
                        .await
                        .map_err(|e| self.db(e))?;
                    tries += 1;
                }
                Err(e)
                    if tries < TRIES
                        && e.as_database_error()
                            .and_then(|d| d.code())
                            .is_some_and(|c| c == "23000" || c == "40001") =>
                {
                    tries += 1;
                }
                r => return r.map_err(|e| self.db(e)),
            }
        }
    }

    async fn rate_once(&self, name: &LockName, cost: RateCost) -> sqlx::Result<Option<Duration>> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(i64, i64)> = sqlx::query_as(RATE_LOCK)
            .bind(name.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let (tat, now) = match row {
            Some(r) => r,
            None => (0, sqlx::query_scalar(RATE_NOW).fetch_one(&mut *tx).await?),
        };
        let decision = gcra(tat.max(0) as u64, now.max(0) as u64, cost);
        if let Ok(next) = decision {
            let query = if row.is_some() {
                sqlx::query(RATE_SET).bind(next as i64).bind(name.as_str())
            } else {
                sqlx::query(RATE_NEW).bind(name.as_str()).bind(next as i64)
            };
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(decision.err())
    }

    /// Keeps this client's watcher row of `key` (see [`watcher_row`])
    /// alive for [`QUEUE_TTL`] more, making it if there is none (and
    /// dropping every lapsed watcher row then, so that rows of names no
    /// longer watched do not pile up).
    async fn refresh_watcher(&self, key: &[u8]) -> Result<()> {
        self.start_doorbell().await?;
        let bell = self.bell.load(Ordering::Acquire);
        let ttl = ms(QUEUE_TTL);
        let r = sqlx::query(REFRESH_WATCHER)
            .bind(ttl)
            .bind(key)
            .bind(bell)
            .execute(&self.pool)
            .await
            .map_err(|e| self.db(e))?;
        if r.rows_affected() == 0 {
            sqlx::query(PURGE_WATCHERS)
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            sqlx::query(INSERT_WATCHER)
                .bind(key)
                .bind(bell)
                .bind(ttl)
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
        }
        Ok(())
    }

    /// Rings the doorbell of every client watching register `name` (this
    /// one's waiters are woken directly), in the background: the write is
    /// done, and its caller does not wait for the watchers. Best effort:
    /// a watcher not rung looks again on its own.
    async fn ring_watchers(&self, name: &LockName) {
        self.wakeups.wake(&register_key(name.as_str()));
        let key = watcher_row(name);
        let (pool, mine) = (self.pool.clone(), self.bell.load(Ordering::Acquire));
        tokio::spawn(async move {
            let rows: Vec<(i64,)> = match sqlx::query_as(WATCHER_BELLS)
                .bind(&key)
                .fetch_all(&pool)
                .await
            {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::debug!(error = %e, "could not list register watchers; they will look again on their own");
                    return;
                }
            };
            for (bell,) in rows.into_iter().filter(|(b,)| *b != mine) {
                let rung = bell > 0
                    && sqlx::query(sqlx::AssertSqlSafe(format!("KILL QUERY {bell}")))
                        .execute(&pool)
                        .await
                        .is_ok();
                if !rung {
                    let _ = sqlx::query(FORGET_BELL).bind(bell).execute(&pool).await;
                }
            }
        });
    }

    async fn write_register(&self, write: RegisterWrite<'_>) -> Result<bool> {
        match write.rule {
            WriteRule::Version(v) => self.swap_register(write, v).await,
            _ => self.write_by_lock(write).await,
        }
    }

    /// A fenced or unfenced write: the row is locked, the rule decided on
    /// the fence read, then the row written, in one transaction.
    async fn write_by_lock(&self, write: RegisterWrite<'_>) -> Result<bool> {
        if let WriteRule::Fence(f) = write.rule {
            crate::spi::codec::fence_i64(f)?;
        }
        let mut tx = self.pool.begin().await.map_err(|e| self.db(e))?;
        let row = sqlx::query(REGISTER_LOCK)
            .bind(write.name.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.db(e))?;
        let seen: i64 = match &row {
            Some(r) => r.try_get("fence").map_err(|e| self.db(e))?,
            None => 0,
        };
        let Some(fence) = write.rule.fence_after(write.name, seen as u64)? else {
            return Ok(false);
        };
        sqlx::query(REGISTER_UPSERT)
            .bind(write.name.as_str())
            .bind(write.value)
            .bind(crate::spi::codec::fence_i64(fence)?)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.db(e))?;
        tx.commit().await.map_err(|e| self.db(e))?;
        Ok(true)
    }

    /// A versioned compare-and-set in one statement: the fence always
    /// changes, so a matched row is an affected row.
    async fn swap_register(&self, write: RegisterWrite<'_>, expected: u64) -> Result<bool> {
        // The version after it must fit the column too.
        crate::spi::codec::fence_i64(crate::spi::codec::next_version(write.name, expected)?)?;
        let expected = crate::spi::codec::fence_i64(expected)?;
        let r = sqlx::query(REGISTER_SWAP)
            .bind(write.value)
            .bind(write.name.as_str())
            .bind(expected)
            .execute(&self.pool)
            .await
            .map_err(|e| self.db(e))?;
        if r.rows_affected() == 1 || expected != 0 {
            return Ok(r.rows_affected() == 1);
        }
        // Never written: of racing creators, one insert wins.
        let r = sqlx::query(REGISTER_CREATE)
            .bind(write.name.as_str())
            .bind(write.value)
            .execute(&self.pool)
            .await
            .map_err(|e| self.db(e))?;
        Ok(r.rows_affected() == 1)
    }
}
