//! Owners: who holds a lock, for reentrancy and owner-only release.

use crate::error::{Error, Result};
use std::fmt;
use std::sync::Arc;

/// The longest owner id, in bytes.
pub const MAX_OWNER_LEN: usize = 128;

/// The identity that holds a lock, for opt-in reentrancy.
///
/// **By default every acquisition is its own owner**: two acquisitions of
/// one lock exclude each other whether they come from two processes, two
/// clients, or two tasks sharing one [`Client`](crate::Client), as
/// `tokio::sync::Mutex` excludes tasks. A service shares one client across
/// its request handlers, and two requests for one order must not both get
/// in.
///
/// Reentrancy is for code that takes a lock it may already hold, and it
/// is per owner, not per thread (async tasks move between threads): pass
/// the same `Owner` to [`Lock::owner`](crate::Lock::owner), or run the
/// code inside [`Owner::scope`], and the second acquisition nests into the
/// first (the hold count rises; the lock is released when it falls back
/// to zero).
///
/// In the backend a hold is recorded as `<client id>:<owner id>` (Redisson's
/// `<client uuid>:<thread id>`), so owners of different clients never
/// collide even when their ids are equal.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use fenced::Owner;
/// let client = fenced::Client::connect("memory://").await?;
/// let lock = client.mutex("orders:1001")?;
/// let first = lock.acquire().await?;
/// // Another acquisition, even on the same client, is another owner:
/// assert!(lock.try_acquire().await?.is_none());
/// drop(first);
///
/// // Reentrancy is asked for by naming an owner.
/// let me = Owner::new();
/// let outer = lock.clone().owner(&me).acquire().await?;
/// let inner = lock.clone().owner(&me).acquire().await?;
/// assert_eq!(inner.hold_count(), 2);
/// # drop((outer, inner));
/// assert_eq!(Owner::named("worker-7").unwrap().id(), "worker-7");
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// A fresh owner with a random id.
    pub fn new() -> Self {
        Owner(uuid::Uuid::new_v4().simple().to_string().into())
    }

    /// An owner with a chosen id: 1 to [`MAX_OWNER_LEN`] bytes, no control characters.
    pub fn named(id: &str) -> Result<Self> {
        if id.is_empty() || id.len() > MAX_OWNER_LEN || id.chars().any(char::is_control) {
            return Err(Error::invalid(format!(
                "owner id {id:?} must be 1 to {MAX_OWNER_LEN} bytes with no control characters"
            )));
        }
        Ok(Owner(id.into()))
    }

    /// The owner's id.
    pub fn id(&self) -> &str {
        &self.0
    }

    /// Runs `f` with this owner as the owner of every acquisition in it
    /// that names none (on this task: the scope does not reach tasks `f`
    /// spawns). Code deep in a request handler can then take a lock the
    /// handler already holds without passing the owner down.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let client = fenced::Client::connect("memory://").await?;
    /// let lock = client.mutex("report")?;
    /// fenced::Owner::new()
    ///     .scope(async {
    ///         let outer = lock.acquire().await?;
    ///         let inner = lock.acquire().await?; // nests: same owner
    ///         assert_eq!(inner.hold_count(), 2);
    ///         # drop((outer, inner));
    ///         Ok::<_, fenced::Error>(())
    ///     })
    ///     .await?;
    /// # Ok::<_, fenced::Error>(()) }).unwrap();
    /// ```
    pub async fn scope<F: std::future::Future>(&self, f: F) -> F::Output {
        SCOPE.scope(self.clone(), f).await
    }

    /// The owner of the enclosing [`Owner::scope`] on this task, if any.
    pub fn current() -> Option<Owner> {
        SCOPE.try_with(Owner::clone).ok()
    }
}

tokio::task_local! {
    static SCOPE: Owner;
}

impl Default for Owner {
    fn default() -> Self {
        Owner::new()
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({})", self.0)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
