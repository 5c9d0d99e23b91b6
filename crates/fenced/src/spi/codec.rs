//! How values are spelled in storage: fences as SQL integers, registers as
//! decimal text, versions, and the stable hash of a name.

use crate::error::{Error, Result};
use crate::name::LockName;

/// A fence as SQL's signed 64-bit integer.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn fence_i64(f: u64) -> Result<i64> {
    i64::try_from(f).map_err(|_| {
        Error::invalid(format!(
            "fencing token {f} is beyond what this backend issues"
        ))
    })
}

/// The version after `v` for a versioned compare-and-set, refused when it
/// would not fit (a version read from somewhere else than this backend).
pub(crate) fn next_version(name: &LockName, v: u64) -> Result<u64> {
    v.checked_add(1).ok_or_else(|| {
        Error::invalid(format!(
            "version {v} of {:?} has no successor: versions count writes from 0",
            name.as_str()
        ))
    })
}

/// A register's value read as a decimal integer.
pub(crate) fn parse_i64(name: &LockName, v: &[u8]) -> Result<i64> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            Error::protocol(format!(
                "register {:?} holds {:?}, not a decimal integer",
                name.as_str(),
                String::from_utf8_lossy(&v[..v.len().min(40)])
            ))
        })
}

/// FNV-1a (64-bit): the standard hashers promise no stability across Rust
/// releases, and every process of a service must map a key to the same
/// segment and a name to the same advisory key. Pinned by test vectors.
pub(crate) use fnv::FnvHasher as Fnv1a;
