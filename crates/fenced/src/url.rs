//! Backend URLs: the scheme picks the backend.

use crate::error::{Error, Result};
use crate::spi::Backend;
use crate::spi::endpoints::redact;
use crate::spi::wake::Wakeups;
use std::path::PathBuf;
use std::sync::Arc;

/// Opens the backend a URL names, through the [backend table](crate::backends).
pub(crate) async fn open(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
    let Some((scheme, _)) = url.split_once(':') else {
        return Err(Error::invalid(format!(
            "backend URL {:?} has no scheme; try sqlite:///path/locks.db or memory://",
            redact(url)
        )));
    };
    let built = || {
        let schemes: Vec<&str> = crate::backends()
            .iter()
            .filter(|b| b.is_built())
            .flat_map(|b| b.schemes.iter().copied())
            .collect();
        schemes.join(", ")
    };
    match crate::backend_for_scheme(scheme) {
        Some(b) => match b.opener() {
            Some(open) => open(url.to_owned(), wakeups).await,
            None => Err(Error::invalid(format!(
                "the {scheme}:// backend is not in this build of fenced (cargo feature `{}`); \
                 this build has: {}",
                b.feature.unwrap_or(b.name),
                built()
            ))),
        },
        None => Err(Error::invalid(format!(
            "unknown backend URL scheme {scheme:?} in {:?}; this build has: {}",
            redact(url),
            built()
        ))),
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
