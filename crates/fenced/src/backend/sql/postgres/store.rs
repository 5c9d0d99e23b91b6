//! Registers.

use super::*;
use crate::backend::sql::read_register;
use crate::spi::wake::register_key;

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
                self.wake_waiters(&register_key(write.name.as_str())).await;
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
                self.wake_waiters(&register_key(name.as_str())).await;
            }
            Ok(after)
        })
    }

    fn watch_register<'a>(&'a self, _name: &'a LockName) -> Reply<'a, ()> {
        // The listener hears every NOTIFY on the channel, writes' too.
        Box::pin(async { Ok(()) })
    }
}

impl Backend for PgBackend {}
