//! The fenced register: the resource side of fencing.

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::Guard;
use crate::name::LockName;
use crate::spi::WriteRule;
use crate::spi::codec::parse_i64;

/// A value stored in the lock backend that accepts a write only with a
/// fencing token at least as high as the highest it has seen.
///
/// This is what makes a lease lock safe against a holder that was paused
/// past its lease (GC, SIGSTOP, a slow disk): when it wakes and writes, its
/// token is lower than the new holder's, and the write is refused with
/// [`StaleToken`](ErrorKind::StaleToken). Build the same check into your own
/// resource (a `WHERE fence <= $token` in SQL, a compare in a script) when
/// the protected data lives elsewhere.
///
/// Values are bytes; integers are stored as decimal text, as Redis does,
/// so [`try_decrement`](FencedRegister::try_decrement) can work on them.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://fence-doc").await?;
/// let lock = client.mutex("stock")?;
/// let stock = client.register("stock:value")?;
///
/// let old = lock.acquire().await?;
/// let old_token = old.fencing_token();
/// lock.force_unlock().await?;                         // old holder loses it ...
/// let new = lock.clone().owner(&fenced::Owner::new()).acquire().await?;
/// stock.write(&new, b"41").await?;                    // ... the new holder writes,
/// let stale = stock.write_with_token(old_token, b"40").await.unwrap_err();
/// assert_eq!(stale.kind(), fenced::ErrorKind::StaleToken); // the stale one cannot.
/// assert_eq!(stock.read_i64().await?, Some(41));
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct FencedRegister {
    client: Client,
    name: LockName,
}

impl FencedRegister {
    pub(crate) fn new(client: Client, name: LockName) -> Self {
        FencedRegister { client, name }
    }

    /// The register's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The register's name, checked.
    pub(crate) fn lock_name(&self) -> &LockName {
        &self.name
    }

    /// The value and the highest fence seen, or `None` if never written.
    pub async fn read(&self) -> Result<Option<(Vec<u8>, u64)>> {
        self.client
            .inner
            .read("register_read", |b| b.register_read(&self.name))
            .await
    }

    /// The value as a decimal integer.
    pub async fn read_i64(&self) -> Result<Option<i64>> {
        match self.read().await? {
            None => Ok(None),
            Some((v, _)) => parse_i64(&self.name, &v).map(Some),
        }
    }

    /// Writes `value` under the guard's fencing token.
    ///
    /// # Errors
    /// [`StaleToken`](ErrorKind::StaleToken) if a higher token has written before.
    pub async fn write(&self, guard: &Guard, value: impl AsRef<[u8]>) -> Result<()> {
        self.write_with_token(guard.fencing_token(), value).await
    }

    /// Writes `value` under `token` (a token carried across a process
    /// boundary, such as `FENCED_TOKEN` from `fenced run`).
    ///
    /// # Errors
    /// [`StaleToken`](ErrorKind::StaleToken) if a higher token has written before.
    pub async fn write_with_token(&self, token: u64, value: impl AsRef<[u8]>) -> Result<()> {
        let accepted = (self.client.inner)
            .write_register(&self.name, value.as_ref(), WriteRule::Fence(token))
            .await?;
        if accepted {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::StaleToken,
                format!(
                    "register {:?} refused token {token}: a higher token has written",
                    self.name.as_str()
                ),
            ))
        }
    }

    /// Writes with no fence check (to seed the value, or to show what goes
    /// wrong without a lock). The highest fence seen is kept.
    pub async fn write_unfenced(&self, value: impl AsRef<[u8]>) -> Result<()> {
        (self.client.inner)
            .write_register(&self.name, value.as_ref(), WriteRule::Always)
            .await
            .map(|_| ())
    }

    /// Atomically subtracts `by` from the integer value unless that would
    /// take it below zero, in one server-side step (no lock needed): the
    /// flash sale's "atomic" mode. The new value, or `None` if there was
    /// not enough (or no value at all).
    pub async fn try_decrement(&self, by: i64) -> Result<Option<i64>> {
        if by < 0 {
            return Err(Error::invalid(format!(
                "cannot decrement by a negative amount ({by})"
            )));
        }
        let inner = &self.client.inner;
        inner
            .write(
                "register_decrement",
                inner.backend.register_decrement(&self.name, by),
            )
            .await
    }
}
