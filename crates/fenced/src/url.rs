//! Backend URLs: the scheme picks the backend.

use crate::backend::Backend;
use crate::error::{Error, Result};
use std::path::PathBuf;
use std::sync::Arc;

/// Schemes fenced knows, with the cargo feature that builds each.
const PLANNED: &[(&str, &str)] = &[
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+sentinel", "redis"),
    ("redis+cluster", "redis"),
    ("redlock", "redlock"),
    ("zk", "zookeeper"),
    ("etcd", "etcd"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
];

pub(crate) async fn open(url: &str) -> Result<Arc<dyn Backend>> {
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(Error::invalid(format!(
            "backend URL {:?} has no scheme; try sqlite:///path/locks.db or memory://",
            redact(url)
        )));
    };
    match scheme {
        "memory" => {
            let ns = rest.strip_prefix("//").unwrap_or(rest);
            Ok(crate::backend::memory::MemoryBackend::open(ns)?)
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            Ok(crate::backend::sqlite::SqliteBackend::open(path).await?)
        }
        _ => {
            let known: Vec<&str> = std::iter::once("memory")
                .chain(cfg!(feature = "sqlite").then_some("sqlite"))
                .collect();
            match PLANNED
                .iter()
                .chain([("sqlite", "sqlite")].iter())
                .find(|(s, _)| *s == scheme)
            {
                Some((_, feature)) => Err(Error::invalid(format!(
                    "the {scheme}:// backend is not in this build of fenced (cargo feature \
                     `{feature}`); this build has: {}",
                    known.join(", ")
                ))),
                None => Err(Error::invalid(format!(
                    "unknown backend URL scheme {scheme:?} in {:?}; this build has: {}",
                    redact(url),
                    known.join(", ")
                ))),
            }
        }
    }
}

/// The URL with any password replaced by `***`, for logs and errors.
pub(crate) fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// Where the CLI and [`Client::from_env`](crate::Client::from_env) keep
/// their SQLite file when no backend is named:
/// `$XDG_STATE_HOME/fenced/locks.db`, else `$HOME/.local/state/fenced/locks.db`.
pub fn default_sqlite_path() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_STATE_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => match std::env::var_os("HOME") {
            Some(h) if !h.is_empty() => PathBuf::from(h).join(".local/state"),
            _ => {
                return Err(Error::invalid(
                    "neither XDG_STATE_HOME nor HOME is set; name a backend with FENCED_BACKEND",
                ));
            }
        },
    };
    Ok(base.join("fenced").join("locks.db"))
}

pub(crate) fn default_url() -> Result<String> {
    let path = default_sqlite_path()?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::unavailable(format!("cannot create {}", dir.display())).with_source(e)
        })?;
    }
    Ok(format!("sqlite://{}", path.display()))
}
