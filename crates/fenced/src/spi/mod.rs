//! The floor: what the core and every backend share, and nothing above it.
//!
//! This module imports only `error`, `name`, std and tokio. The core
//! (`core/`) and the backends (`backend/`) import it; it imports neither.
//!
//! - [`backend`]: the traits a backend implements, with their contract.
//! - [`types`]: one attempt, its outcome, a renewal's answer, a hold's
//!   reference, status.
//! - [`grant`]: the pure grant rule for backends that decide grants
//!   themselves.
//! - [`wake`]: where waiters are woken.
//! - [`lease`]: lease and session arithmetic.
//! - [`rate`]: the rate limiter's rule.
//! - [`endpoints`]: backend URLs.
//! - [`codec`]: how fences, registers and names are spelled in storage.

pub(crate) mod backend;
pub(crate) mod codec;
pub(crate) mod endpoints;
pub(crate) mod grant;
pub(crate) mod lease;
pub(crate) mod rate;
pub(crate) mod sync;
pub(crate) mod types;
pub(crate) mod wake;

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) use backend::ElectionLayout;
pub(crate) use backend::{Backend, Codec, DEFAULT_TIMEOUT, LockBackend, Store};
#[cfg(feature = "zookeeper")]
pub(crate) use backend::{BarrierLayout, NodeLayout};
pub(crate) use types::*;
