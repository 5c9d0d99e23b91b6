//! Registers.

use super::*;
use crate::backend::sql::read_register;

impl Store for MySqlBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        let err = |e| self.db(e);
        Box::pin(read_register(&self.pool, REGISTER_READ, name, err))
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        Box::pin(self.write_register(write))
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
            Ok(Some(n - by))
        })
    }
}

impl Backend for MySqlBackend {}

impl MySqlBackend {
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
