//! Registers.

use super::*;

impl Store for MySqlBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<RegisterValue>> {
        Box::pin(async move {
            let row = sqlx::query(REGISTER_READ)
                .bind(name.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            row.map(|r| {
                let v: Vec<u8> = r.try_get("value")?;
                let f: i64 = r.try_get("fence")?;
                Ok((v, f as u64))
            })
            .transpose()
            .map_err(|e| self.db(e))
        })
    }

    fn register_write<'a>(
        &'a self,
        name: &'a LockName,
        fence: Option<u64>,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let fence = fence.map(crate::spi::codec::fence_i64).transpose()?;
            let mut tx = self.pool.begin().await.map_err(|e| self.db(e))?;
            let row = sqlx::query(REGISTER_LOCK)
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| self.db(e))?;
            let seen: i64 = match &row {
                Some(r) => r.try_get("fence").map_err(|e| self.db(e))?,
                None => 0,
            };
            let new_fence = match fence {
                Some(f) if f < seen => return Ok(false),
                Some(f) => f,
                None => seen,
            };
            sqlx::query(REGISTER_UPSERT)
                .bind(name.as_str())
                .bind(value)
                .bind(new_fence)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.db(e))?;
            tx.commit().await.map_err(|e| self.db(e))?;
            Ok(true)
        })
    }

    fn register_swap<'a>(
        &'a self,
        name: &'a LockName,
        expected: u64,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            // The version after it must fit the column too.
            crate::spi::codec::fence_i64(crate::spi::codec::next_version(name, expected)?)?;
            let expected = crate::spi::codec::fence_i64(expected)?;
            // The fence always changes, so a matched row is an affected row.
            let r = sqlx::query(REGISTER_SWAP)
                .bind(value)
                .bind(name.as_str())
                .bind(expected)
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            if r.rows_affected() == 1 || expected != 0 {
                return Ok(r.rows_affected() == 1);
            }
            // Never written: of racing creators, one insert wins.
            let r = sqlx::query(REGISTER_CREATE)
                .bind(name.as_str())
                .bind(value)
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            Ok(r.rows_affected() == 1)
        })
    }

    fn register_decrement<'a>(
        &'a self,
        name: &'a LockName,
        by: i64,
    ) -> BoxFuture<'a, Result<Option<i64>>> {
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
