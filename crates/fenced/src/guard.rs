//! Guards: proof of a hold, with its fencing token and lost signal.

use crate::core::engine::Engine;
use crate::core::hold::{Hold, LostReason};
use crate::error::Result;
use crate::spi::Mode;
use crate::spi::Ownership;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A held lock (or read hold, or semaphore permits).
///
/// Dropping the guard releases the hold in the background (the client's
/// worker does the I/O; `Drop` never blocks). Call [`Guard::release`] to
/// release now and learn whether the hold was still yours.
///
/// A guard can tell without a round trip whether it still believes it
/// holds the lock ([`Guard::is_held`]), and [`Guard::lost`] resolves when
/// the hold is lost. Pass [`Guard::fencing_token`] to the resource you
/// protect (see [`FencedRegister`](crate::FencedRegister)) so that it can
/// turn away a holder that lost the lock without noticing, for example
/// after a long pause.
#[must_use = "dropping a guard releases the lock at once"]
#[clippy::has_significant_drop]
pub struct Guard {
    hold: Arc<Hold>,
    client: Arc<Engine>,
    done: bool,
}

impl Guard {
    pub(crate) fn new(hold: Arc<Hold>, client: Arc<Engine>) -> Self {
        Guard {
            hold,
            client,
            done: false,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.hold.name().as_str()
    }

    /// How the lock is held.
    pub fn mode(&self) -> Mode {
        self.hold.mode
    }

    pub(crate) fn hold_ref(&self) -> &crate::spi::HoldRef {
        &self.hold.r
    }

    /// Stops believing in the hold: the server has shown that another
    /// holder came after it. Fires the lost signal and lets the hold go.
    pub(crate) fn lose(&self, reason: crate::LostReason) {
        self.hold.mark_lost(reason);
    }

    pub(crate) fn client(&self) -> &Arc<Engine> {
        &self.client
    }

    /// The fencing token of this grant: greater than every token issued
    /// before for this name on this backend. Nested guards of one owner
    /// share their first grant's token.
    pub fn fencing_token(&self) -> u64 {
        self.hold.token
    }

    /// Whether this client still believes it holds the lock: not lost, and
    /// the lease confirmed by the backend has not run out on the local
    /// monotonic clock. No round trip.
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// Where the backend records this hold, for an ownership-guarded write
    /// in your own transaction on the same store, like etcd's `IsOwner`:
    /// on etcd the hold's key and its create revision (compare
    /// `CreateRevision(key) == revision` in your `Txn`); on ZooKeeper the
    /// node's path (unique: sequential) and `czxid` (a `check` op on the
    /// path in your `multi`).
    /// `None` on backends whose holds have no such record; use the fencing
    /// token there.
    pub fn ownership(&self) -> Option<Ownership> {
        self.client.backend.ownership(&self.hold.r)
    }

    /// Lease left as far as this client can be sure (zero once lost).
    pub fn lease_left(&self) -> Duration {
        self.hold.lease_left()
    }

    /// How many guards of this owner share the hold (reentrancy depth).
    pub fn hold_count(&self) -> u32 {
        self.hold.count()
    }

    /// A future that resolves when the hold is lost: renewal found it gone,
    /// or its lease ran out without a confirmed renewal. It never resolves
    /// after the hold is released. It does not borrow the guard, so it can
    /// sit in a `select!` beside the work the lock protects.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use std::time::Duration;
    /// let client = fenced::Client::connect("memory://").await.unwrap();
    /// let guard = client.mutex("job").unwrap()
    ///     .fixed_lease(Duration::from_millis(50))
    ///     .acquire().await.unwrap();
    /// let reason = guard.lost().await; // the fixed lease runs out
    /// assert!(!guard.is_held());
    /// assert_eq!(reason, fenced::LostReason::Expired);
    /// # });
    /// ```
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.hold.clone().lost()
    }

    /// Releases now. Returns `true` when the hold was still ours in the
    /// backend (or, for a nested guard, when the outer hold still is) and
    /// `false` when it had been lost: nothing is applied to a new holder.
    ///
    /// # Cancel safety
    /// If this future is dropped before it finishes, the release still
    /// happens in the background.
    pub async fn release(mut self) -> Result<bool> {
        self.done = true;
        let hold = self.hold.clone();
        let client = self.client.clone();
        drop(self);
        client.release_hold(hold).await
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.done {
            self.client.drop_hold(&self.hold);
        }
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.hold.name())
            .field("mode", &self.hold.mode)
            .field("token", &self.hold.token)
            .field("held", &self.is_held())
            .field("count", &self.hold.count())
            .finish()
    }
}
