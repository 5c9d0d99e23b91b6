//! The backends, a folder per engine family, and the one table of them
//! ([`table`]). Each implements the traits of [`spi`](crate::spi), whose
//! contract it must keep.
//!
//! Reentrancy, the watchdog, timeouts, retries, the lost signal and
//! cancellation cleanup are written once in `core/`; a backend only knows
//! how to try one grant atomically, extend and drop holds, and tell waiters
//! that a name changed (through [`Wakeups`](crate::spi::wake::Wakeups)).
//! Mutex, read-write lock and semaphore are one machine with three modes;
//! the grant rule for backends that decide grants themselves is
//! [`spi::grant::grantable`](crate::spi::grant::grantable).

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) mod queue;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod sql;
pub(crate) mod table;
#[cfg(feature = "zookeeper")]
pub(crate) mod zk;
