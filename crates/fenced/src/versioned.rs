//! Optimistic concurrency: a value with a version, changed only by a
//! compare-and-set on that version.

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};
use crate::name::LockName;
use crate::spi::WriteRule;
use std::time::Duration;

/// A value and the number of writes that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// The bytes written last.
    pub value: Vec<u8>,
    /// How many compare-and-sets have succeeded; 0 if never written.
    pub version: u64,
}

/// A value in the lock backend changed by versioned compare-and-set: the
/// seeds' optimistic lock (`UPDATE … SET value = ?, version = version + 1
/// WHERE id = ? AND version = ?`) without a lock. Readers never block;
/// of two writers that read the same version, exactly one succeeds and the
/// other learns it must read again. This suits rare conflicts; when many
/// writers contend, a [`Lock`](crate::Lock) wastes less work.
///
/// On SQL backends it is that very statement on `fenced_registers`; on
/// Redis, one script on the register's hash. A versioned value shares the
/// register namespace: do not use one name both as a
/// [`FencedRegister`](crate::FencedRegister) and as a versioned value.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://versioned-doc").await?;
/// let stock = client.versioned("stock:42")?;
/// assert!(stock.compare_and_set(0, b"10").await?);       // create: version 0 → 1
/// assert!(!stock.compare_and_set(0, b"99").await?);      // stale version: refused
/// let now = stock
///     .update(|v| {
///         let n: i64 = std::str::from_utf8(v.unwrap_or(b"0")).unwrap().parse().unwrap();
///         Ok((n - 1).to_string().into_bytes())
///     })
///     .await?;
/// assert_eq!((now.value, now.version), (b"9".to_vec(), 2));
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct VersionedValue {
    client: Client,
    name: LockName,
    max_conflicts: u32,
}

impl VersionedValue {
    pub(crate) fn new(client: Client, name: LockName) -> Self {
        VersionedValue {
            client,
            name,
            max_conflicts: 100,
        }
    }

    /// The client it was made by.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The value's name, checked.
    pub(crate) fn lock_name(&self) -> &LockName {
        &self.name
    }

    /// The value's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// How many lost races [`update`](Self::update) takes before it gives
    /// up (default 100).
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn max_conflicts(mut self, n: u32) -> Self {
        self.max_conflicts = n;
        self
    }

    /// The value and its version, or `None` if never written.
    pub async fn read(&self) -> Result<Option<Versioned>> {
        let got = self
            .client
            .inner
            .read("register_read", |b| b.register_read(&self.name))
            .await?;
        Ok(got.map(|(value, version)| Versioned { value, version }))
    }

    /// Writes `value` if the version is still `version` (0: never
    /// written); `true` when written, the version then being `version + 1`,
    /// and `false` when another writer got there first.
    pub async fn compare_and_set(&self, version: u64, value: impl AsRef<[u8]>) -> Result<bool> {
        (self.client.inner)
            .write_register(&self.name, value.as_ref(), WriteRule::Version(version))
            .await
    }

    /// Reads, applies `f` to the value (`None` if never written) and
    /// writes the result by compare-and-set, again from a fresh read after
    /// each lost race, with a short random pause. The value written.
    ///
    /// # Errors
    /// What `f` returns, and [`TimedOut`](ErrorKind::TimedOut) after
    /// [`max_conflicts`](Self::max_conflicts) lost races in a row.
    pub async fn update<F>(&self, mut f: F) -> Result<Versioned>
    where
        F: FnMut(Option<&[u8]>) -> Result<Vec<u8>>,
    {
        for lost in 0..=self.max_conflicts {
            let current = self.read().await?;
            let version = current.as_ref().map_or(0, |c| c.version);
            let value = f(current.as_ref().map(|c| c.value.as_slice()))?;
            if self.compare_and_set(version, &value).await? {
                return Ok(Versioned {
                    value,
                    version: version + 1,
                });
            }
            // Spread the losers out: up to 1, 2, 4 … 32 ms.
            let cap = 1u64 << lost.min(5);
            tokio::time::sleep(Duration::from_micros(fastrand::u64(0..cap * 1000))).await;
        }
        Err(Error::new(
            ErrorKind::TimedOut,
            format!(
                "versioned value {:?}: other writers won {} races in a row; use a lock \
                 when writers contend this much",
                self.name.as_str(),
                self.max_conflicts + 1
            ),
        ))
    }
}
