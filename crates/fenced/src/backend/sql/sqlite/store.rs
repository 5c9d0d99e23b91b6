//! Registers.

use super::*;

impl Store for SqliteBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<RegisterValue>> {
        Box::pin(async move {
            let row = q(REGISTER_READ)
                .bind(name.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            row.map(|r| {
                let v: Vec<u8> = r.try_get("value").map_err(db)?;
                let f: i64 = r.try_get("fence").map_err(db)?;
                Ok((v, f as u64))
            })
            .transpose()
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
                    q(REGISTER_FENCED)
                        .bind(name.as_str())
                        .bind(value)
                        .bind(f)
                        .execute(&self.pool)
                        .await
                }
                None => {
                    q(REGISTER_UNFENCED)
                        .bind(name.as_str())
                        .bind(value)
                        .execute(&self.pool)
                        .await
                }
            }
            .map_err(db)?;
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
            let r = if expected == 0 {
                q(REGISTER_CREATE).bind(name.as_str()).bind(value)
            } else {
                q(REGISTER_SWAP)
                    .bind(name.as_str())
                    .bind(value)
                    .bind(expected)
            }
            .execute(&self.pool)
            .await
            .map_err(db)?;
            Ok(r.rows_affected() == 1)
        })
    }

    fn register_decrement<'a>(
        &'a self,
        name: &'a LockName,
        by: i64,
    ) -> BoxFuture<'a, Result<Option<i64>>> {
        Box::pin(async move {
            let row = q(REGISTER_DECREMENT)
                .bind(name.as_str())
                .bind(by)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            scalar(row)
        })
    }
}

impl Backend for SqliteBackend {}
