//! The one error type of fenced.
//!
//! Callers match on [`Error::kind`]; the engine's own error, when there is
//! one, stays behind [`std::error::Error::source`] so that a backend's client
//! crate never leaks into the public API.

use std::fmt;

/// A result whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, coarsely enough to act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock was busy and the caller asked not to wait.
    WouldBlock,
    /// The lock was not had within the wait the caller allowed.
    TimedOut,
    /// The hold was lost (lease expired, taken away, session ended) before
    /// the operation could complete.
    Lost,
    /// The caller does not hold what it tried to release or extend.
    NotHeld,
    /// A write to a fenced resource carried a token lower than one the
    /// resource has already seen: the writer is a stale holder.
    StaleToken,
    /// A name, URL, lease, permit count or other argument was rejected
    /// before any I/O; the message names the value and the rule.
    InvalidInput,
    /// The backend could not be reached or did not answer in time. Usually
    /// transient; acquisitions retry these under their [`RetryPolicy`](crate::RetryPolicy).
    Unavailable,
    /// The backend answered something fenced does not understand, or its
    /// state breaks fenced's layout (for example a foreign key of the wrong type).
    Protocol,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::WouldBlock => "would block",
            ErrorKind::TimedOut => "timed out",
            ErrorKind::Lost => "lock lost",
            ErrorKind::NotHeld => "not held",
            ErrorKind::StaleToken => "stale fencing token",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::Unavailable => "backend unavailable",
            ErrorKind::Protocol => "protocol error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error from fenced: a [`kind`](Error::kind) to match on, a message
/// for people, and the engine's error as its `source`.
///
/// ```
/// use fenced::{Client, ErrorKind};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let err = Client::connect("carrier-pigeon://coop").await.unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidInput);
/// assert!(err.to_string().contains("carrier-pigeon"));
/// # });
/// ```
#[derive(thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<BoxError>,
}

impl Error {
    /// A new error of `kind` with a message for people.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// The same error, carrying the engine's error as its source.
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// True when retrying the same operation may succeed.
    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Unavailable
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidInput, message)
    }

    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unavailable, message)
    }

    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Protocol, message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}
