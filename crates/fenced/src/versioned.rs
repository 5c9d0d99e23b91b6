//! Optimistic concurrency: a value with a version, changed only by a
//! compare-and-set on that version.

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};
use crate::name::LockName;
use crate::spi::{Codec, WriteRule};
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
    /// Kept in the engine's own layout of recipe values, in this form,
    /// where the backend has one (Curator's nodes on ZooKeeper); set only
    /// by the recipes that share their state with a foreign client, whose
    /// versions are then opaque.
    native: Option<Codec>,
}

impl VersionedValue {
    pub(crate) fn new(client: Client, name: LockName) -> Self {
        VersionedValue {
            client,
            name,
            max_conflicts: 100,
            native: None,
        }
    }

    /// The same value, kept in the engine's own layout as `codec` says
    /// where the backend has one (see `spi::NodeLayout`).
    pub(crate) fn native(mut self, codec: Codec) -> Self {
        self.native = Some(codec);
        self
    }

    /// The same value, kept in a register whatever the engine.
    pub(crate) fn in_register(mut self) -> Self {
        self.native = None;
        self
    }

    /// The codec, where the value lives in the engine's own layout.
    fn in_layout(&self) -> Option<Codec> {
        self.native
            .filter(|_| self.client.inner.backend.nodes().is_some())
    }

    /// Waits until `done` answers `Some` for the value (its bytes and
    /// version), looking again after each change, woken by the engine;
    /// `None` once `until` has passed (see `Engine::wait_on`).
    pub(crate) async fn wait<T>(
        &self,
        until: Option<tokio::time::Instant>,
        done: impl Fn(crate::spi::RegisterValue) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let inner = &self.client.inner;
        let Some(codec) = self.in_layout() else {
            return inner.wait_register(&self.name, until, done).await;
        };
        let name = &self.name;
        let done = &done;
        inner
            .wait_armed(
                name,
                until,
                |b| watch_node(b, name),
                || async move {
                    let got = inner
                        .read("node_read", |b| node_read(b, name, codec))
                        .await?;
                    done(got)
                },
            )
            .await
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
        let got = self.read_raw().await?;
        Ok(got.map(|(value, version)| Versioned { value, version }))
    }

    /// The value and its version as the store answers them.
    pub(crate) async fn read_raw(&self) -> Result<crate::spi::RegisterValue> {
        let inner = &self.client.inner;
        Ok(match self.in_layout() {
            Some(codec) => {
                inner
                    .read("node_read", |b| node_read(b, &self.name, codec))
                    .await?
            }
            None => {
                inner
                    .read("register_read", |b| b.register_read(&self.name))
                    .await?
            }
        })
    }

    /// Writes `value` if the version is still `version` (0: never
    /// written); `true` when written, the version then being `version + 1`,
    /// and `false` when another writer got there first.
    pub async fn compare_and_set(&self, version: u64, value: impl AsRef<[u8]>) -> Result<bool> {
        let inner = &self.client.inner;
        if let (Some(codec), Some(nodes)) = (self.native, inner.backend.nodes()) {
            let write = nodes.node_write(&self.name, codec, version, value.as_ref());
            return inner.write("node_write", write).await;
        }
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

/// Reads recipe value `name` in the engine's layout (the register where
/// the backend has none, which `in_layout` rules out first).
fn node_read<'a>(
    b: &'a dyn crate::spi::Backend,
    name: &'a LockName,
    codec: Codec,
) -> crate::spi::Reply<'a, crate::spi::RegisterValue> {
    match b.nodes() {
        Some(n) => n.node_read(name, codec),
        None => b.register_read(name),
    }
}

/// Watches recipe value `name` in the engine's layout (as `node_read`).
fn watch_node<'a>(b: &'a dyn crate::spi::Backend, name: &'a LockName) -> crate::spi::Reply<'a, ()> {
    match b.nodes() {
        Some(n) => n.watch_node(name),
        None => b.watch_register(name),
    }
}
