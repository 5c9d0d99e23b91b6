//! Owners: who holds a lock, for reentrancy and owner-only release.

use crate::error::{Error, Result};
use std::fmt;
use std::sync::Arc;

/// The longest owner id, in bytes.
pub const MAX_OWNER_LEN: usize = 128;

/// The identity that holds a lock.
///
/// Reentrancy is per owner, not per thread: async tasks move between
/// threads, so a thread id means nothing. A [`Client`](crate::Client) has a
/// default owner shared by every task that uses it; give a task its own
/// owner when it must exclude the client's other tasks too.
///
/// In the backend a hold is recorded as `<client id>:<owner id>` (Redisson's
/// `<client uuid>:<thread id>`), so owners of different clients never
/// collide even when their ids are equal.
///
/// ```
/// use fenced::Owner;
/// let a = Owner::new();
/// let b = Owner::new();
/// assert_ne!(a, b);
/// assert_eq!(Owner::named("worker-7").unwrap().id(), "worker-7");
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
