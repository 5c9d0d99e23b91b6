//! Validated lock names.

use crate::error::{Error, Result};
use std::fmt;
use std::sync::Arc;

/// The longest lock name, in bytes of UTF-8.
///
/// Long enough for any key a service derives (a path, a URL, an order id
/// with a prefix), short enough to fit every backend's key limits once
/// fenced adds its own prefixes and suffixes.
pub const MAX_NAME_LEN: usize = 512;

/// A lock name, checked once when it is made and never spliced into a
/// script, a path or SQL text: backends pass it as a parameter.
///
/// A name is 1 to [`MAX_NAME_LEN`] bytes of UTF-8 with no control
/// characters (U+0000–U+001F, U+007F–U+009F): those break log lines, C
/// strings and terminal output, and no real lock name needs them. A backend
/// may add rules of its own (ZooKeeper forbids `/`), checked before any I/O.
///
/// ```
/// use fenced::LockName;
/// assert!(LockName::new("orders:1001").is_ok());
/// assert!(LockName::new("").is_err());
/// assert!(LockName::new("bad\nname").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Checks `name` against the rules above.
    pub fn new(name: &str) -> Result<Self> {
        if name.is_empty() {
            return Err(Error::invalid("lock name is empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(Error::invalid(format!(
                "lock name is {} bytes long; the limit is {MAX_NAME_LEN}",
                name.len()
            )));
        }
        if let Some((at, c)) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(Error::invalid(format!(
                "lock name {:?} has the control character {:?} at byte {at}",
                truncate(name, 64),
                c
            )));
        }
        Ok(LockName(name.into()))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert!(LockName::new("a").is_ok());
        assert!(LockName::new("订单-1001").is_ok());
        assert!(LockName::new(&"x".repeat(MAX_NAME_LEN)).is_ok());
        let long = LockName::new(&"x".repeat(MAX_NAME_LEN + 1)).unwrap_err();
        assert!(long.message().contains("513 bytes"), "{long}");
        let nul = LockName::new("a\0b").unwrap_err();
        assert!(nul.message().contains("byte 1"), "{nul}");
        assert!(LockName::new("tab\there").is_err());
    }
}
