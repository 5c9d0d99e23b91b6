//! Backends under test.

use fenced::Client;
use std::any::Any;
use std::path::PathBuf;

/// One backend under test: its URL, what it can do, and whatever must stay
/// alive while the test runs (a temp dir, a server process).
pub struct Fixture {
    /// The backend URL tests connect to.
    pub url: String,
    /// The `fenced` binary, for backends shared between processes.
    pub fenced_bin: Option<PathBuf>,
    _keep: Vec<Box<dyn Any + Send + Sync>>,
}

/// A name no other test uses: tests share backends, never names.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

impl Fixture {
    /// A fresh `memory://` namespace.
    pub fn memory() -> Self {
        Fixture {
            url: format!("memory://{}", unique("t")),
            fenced_bin: None,
            _keep: Vec::new(),
        }
    }

    /// A fresh SQLite file in a temp dir; processes tests run `fenced_bin`.
    pub fn sqlite(fenced_bin: impl Into<PathBuf>) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir for the SQLite file");
        Fixture {
            url: format!("sqlite://{}", dir.path().join("locks.db").display()),
            fenced_bin: Some(fenced_bin.into()),
            _keep: vec![Box::new(dir)],
        }
    }

    /// Any URL, keeping `keep` alive as long as the fixture.
    pub fn new(
        url: String,
        fenced_bin: Option<PathBuf>,
        keep: Vec<Box<dyn Any + Send + Sync>>,
    ) -> Self {
        Fixture {
            url,
            fenced_bin,
            _keep: keep,
        }
    }

    /// A new client of the backend (a new client id, as another process would have).
    pub async fn client(&self) -> Client {
        Client::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }
}
