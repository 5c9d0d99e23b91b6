//! Registers.

use super::*;

impl Store for PgBackend {
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
            let r = match fence {
                Some(f) => {
                    let f = crate::spi::codec::fence_i64(f)?;
                    sqlx::query(REGISTER_FENCED)
                        .bind(name.as_str())
                        .bind(value)
                        .bind(f)
                        .execute(&self.pool)
                        .await
                }
                None => {
                    sqlx::query(REGISTER_UNFENCED)
                        .bind(name.as_str())
                        .bind(value)
                        .execute(&self.pool)
                        .await
                }
            }
            .map_err(|e| self.db(e))?;
            Ok(r.rows_affected() == 1)
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
            let q = if expected == 0 {
                sqlx::query(REGISTER_CREATE).bind(name.as_str()).bind(value)
            } else {
                sqlx::query(REGISTER_SWAP)
                    .bind(name.as_str())
                    .bind(value)
                    .bind(expected)
            };
            let r = q.execute(&self.pool).await.map_err(|e| self.db(e))?;
            Ok(r.rows_affected() == 1)
        })
    }

    fn register_decrement<'a>(
        &'a self,
        name: &'a LockName,
        by: i64,
    ) -> BoxFuture<'a, Result<Option<i64>>> {
        Box::pin(async move {
            let row = sqlx::query(REGISTER_DECREMENT)
                .bind(name.as_str())
                .bind(by)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            row.map(|r| r.try_get::<i64, _>("value"))
                .transpose()
                .map_err(|e| self.db(e))
        })
    }
}

impl Backend for PgBackend {}
