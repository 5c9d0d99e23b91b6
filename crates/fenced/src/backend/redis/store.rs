//! Registers, and raising a name's token floor.

use super::*;
use crate::spi::rate::RateCost;
use crate::spi::wake::register_key;
use std::time::Duration;

impl RedisBackend {
    /// Raises the fencing counter of `name` to at least `token`.
    pub(super) async fn raise(&self, name: &LockName, token: u64) -> Result<()> {
        let k = Keys::of(name)?;
        self.node
            .run(|mut c| async move {
                self.scripts
                    .raise
                    .key(&k.counter)
                    .arg(token)
                    .invoke_async::<()>(&mut c)
                    .await
            })
            .await
    }

    pub(super) async fn register_read_inner(&self, name: &LockName) -> Result<RegisterValue> {
        let k = Keys::of(name)?;
        let (v, f): (Option<Vec<u8>>, Option<u64>) = self
            .node
            .run(|mut c| async move {
                redis::cmd("HMGET")
                    .arg(&k.register)
                    .arg("v")
                    .arg("f")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(v.map(|v| (v, f.unwrap_or(0))))
    }

    pub(super) async fn register_write_inner(&self, write: RegisterWrite<'_>) -> Result<bool> {
        let k = Keys::of(write.name)?;
        let (script, number) = match write.rule {
            WriteRule::Always => (&self.scripts.register_write, String::new()),
            WriteRule::Fence(f) => (&self.scripts.register_write, f.to_string()),
            WriteRule::Version(v) if v >= EXACT_IN_LUA => {
                return Err(Error::invalid(format!(
                    "version {v} of {:?} is beyond what Redis counts exactly (2^53)",
                    write.name.as_str()
                )));
            }
            WriteRule::Version(v) => (&self.scripts.register_swap, v.to_string()),
        };
        let n: i64 = self
            .node
            .run(|mut c| async move {
                script
                    .key(&k.register)
                    .arg(number)
                    .arg(write.value)
                    .arg(&k.register_channel)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(n == 1)
    }

    pub(super) async fn register_decrement_inner(
        &self,
        name: &LockName,
        by: i64,
    ) -> Result<Option<i64>> {
        if by.unsigned_abs() > EXACT_IN_LUA {
            return Err(Error::invalid(format!(
                "cannot decrement {:?} by {by}: beyond what Redis counts exactly (2^53)",
                name.as_str()
            )));
        }
        let k = Keys::of(name)?;
        self.node
            .run(|mut c| async move {
                self.scripts
                    .register_decrement
                    .key(&k.register)
                    .arg(by)
                    .arg(&k.register_channel)
                    .invoke_async(&mut c)
                    .await
            })
            .await
            .map_err(|e| {
                if e.to_string().contains("FENCED_NOT_INTEGER") {
                    Error::protocol(format!(
                        "register {:?} does not hold a decimal integer Redis counts exactly (at most 2^53 either way)",
                        name.as_str()
                    ))
                } else {
                    e
                }
            })
    }
}
impl RedisBackend {
    /// Subscribes to the register's channel (once per client: the
    /// subscription stays while anyone in this client watches it).
    pub(super) async fn watch_register_inner(&self, name: &LockName) -> Result<()> {
        let k = Keys::of(name)?;
        self.subscriber
            .ensure(
                &self.node,
                &[k.register_channel],
                &register_key(name.as_str()),
            )
            .await
            .map(drop)
    }
}

impl RedisBackend {
    pub(super) async fn register_delete_inner(&self, name: &LockName) -> Result<bool> {
        let k = Keys::of(name)?;
        let n: i64 = self
            .node
            .run(|mut c| async move {
                self.scripts
                    .register_delete
                    .key(&k.register)
                    .arg(&k.register_channel)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(n == 1)
    }

    pub(super) async fn register_add_inner(
        &self,
        name: &LockName,
        delta: i64,
    ) -> Result<Option<i64>> {
        if delta.unsigned_abs() > EXACT_IN_LUA {
            return Ok(None);
        }
        let k = Keys::of(name)?;
        let got = self
            .node
            .run(|mut c| async move {
                self.scripts
                    .register_add
                    .key(&k.register)
                    .arg(delta)
                    .arg(&k.register_channel)
                    .invoke_async::<i64>(&mut c)
                    .await
            })
            .await;
        match got {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.to_string().contains("FENCED_NO_ADD") => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn rate_inner(
        &self,
        name: &LockName,
        cost: RateCost,
    ) -> Result<Option<Duration>> {
        let k = Keys::of(name)?;
        let wait: u64 = self
            .node
            .run(|mut c| async move {
                self.scripts
                    .rate
                    .key(&k.rate)
                    .arg(cost.cost_us)
                    .arg(cost.tolerance_us)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok((wait > 0).then(|| Duration::from_micros(wait)))
    }
}

impl Store for RedisBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        Box::pin(self.register_read_inner(name))
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        Box::pin(self.register_write_inner(write))
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        Box::pin(self.register_decrement_inner(name, by))
    }

    fn watch_register<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        Box::pin(self.watch_register_inner(name))
    }

    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool> {
        Box::pin(self.register_delete_inner(name))
    }

    fn rate_acquire<'a>(
        &'a self,
        name: &'a LockName,
        cost: RateCost,
    ) -> Reply<'a, Option<Duration>> {
        Box::pin(self.rate_inner(name, cost))
    }

    fn register_add<'a>(&'a self, name: &'a LockName, delta: i64) -> Reply<'a, Option<i64>> {
        Box::pin(self.register_add_inner(name, delta))
    }
}
