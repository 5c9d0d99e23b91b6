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
/// their SQLite file when no backend is named: one file for the whole
/// host, shared by every user's processes, so that two users who take the
/// same name exclude each other.
///
/// It is `/run/lock/fenced/locks.db` where `/run/lock` is open to every
/// user (Debian and Ubuntu: the FHS place for lock files, a `tmpfs` that a
/// reboot empties, when no holder survives anyway, and which systemd's
/// `PrivateTmp=` does not hide from services), else
/// `/var/tmp/fenced/locks.db` (Fedora and RHEL, whose `/run/lock` only root
/// may write; macOS; containers without `/run/lock`). The choice reads
/// only the mode of `/run/lock`, the same for every user of the host.
///
/// The directory `fenced` is made mode `0777` and the file `0666`: every
/// user may take and release locks, and so, as with any file they may
/// write, break them; a user who wants a private file names one with
/// `FENCED_BACKEND`. The directory is not sticky: SQLite deletes its `-wal`
/// and `-shm` files when the last connection closes and whoever opens next
/// makes them again, and in a sticky directory Linux's
/// `fs.protected_regular` (on by default under systemd) forbids opening
/// another user's file, and the sticky bit forbids deleting it. SQLite
/// opens every file with `O_NOFOLLOW`, so a planted link redirects nothing.
///
/// ```
/// let path = fenced::default_sqlite_path();
/// assert!(path.ends_with("fenced/locks.db"));
/// ```
pub fn default_sqlite_path() -> PathBuf {
    default_sqlite_path_given(std::path::Path::new("/run/lock"))
}

fn default_sqlite_path_given(run_lock: &std::path::Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let open_to_all = std::fs::metadata(run_lock)
        .is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o1777 == 0o1777);
    let base = if open_to_all {
        run_lock.to_path_buf()
    } else {
        PathBuf::from("/var/tmp")
    };
    base.join("fenced").join("locks.db")
}

/// The default URL, after making the host's lock directory if it is missing.
pub(crate) fn default_url() -> Result<String> {
    let path = default_sqlite_path();
    if let Some(dir) = path.parent() {
        make_shared_dir(dir)?;
    }
    Ok(format!("sqlite://{}", path.display()))
}

/// Makes `dir` with mode `0777` (whatever the umask) unless it exists.
fn make_shared_dir(dir: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let cannot = |e: std::io::Error| {
        Error::unavailable(format!(
            "cannot make the host's lock directory {} ({e}); name a backend with FENCED_BACKEND",
            dir.display()
        ))
        .with_source(e)
    };
    if std::fs::symlink_metadata(dir).is_ok() {
        return check_shared_dir(dir);
    }
    // Made under a name of its own, given its whole mode, then renamed into
    // place: no user ever sees it with the umask's narrower mode.
    let parent = dir.parent().unwrap_or(std::path::Path::new("/"));
    let draft = parent.join(format!(
        ".fenced.{}.{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    let made = std::fs::DirBuilder::new()
        .mode(0o777)
        .create(&draft)
        .and_then(|()| std::fs::set_permissions(&draft, std::fs::Permissions::from_mode(0o777)))
        .and_then(|()| std::fs::rename(&draft, dir));
    if made.is_err() {
        let _ = std::fs::remove_dir(&draft);
    }
    use std::io::ErrorKind as K;
    match made {
        Ok(()) => Ok(()),
        // Another process made it a moment before (a rename onto its
        // directory, once it holds the lock file, fails): theirs stands.
        Err(e)
            if matches!(
                e.kind(),
                K::AlreadyExists | K::DirectoryNotEmpty | K::NotADirectory
            ) =>
        {
            check_shared_dir(dir)
        }
        Err(e) => Err(cannot(e)),
    }
}

/// The host's lock directory as another process made it: a directory
/// (not a link) every user may write.
fn check_shared_dir(dir: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Some(meta) = std::fs::symlink_metadata(dir).ok().filter(|m| m.is_dir()) else {
        return Err(Error::unavailable(format!(
            "{} is not a directory; the host's lock file cannot live there \
             (name a backend with FENCED_BACKEND)",
            dir.display()
        )));
    };
    let mode = meta.permissions().mode();
    if mode & 0o777 == 0o777 {
        return Ok(());
    }
    // Working for its owner alone would split the host in two.
    Err(Error::unavailable(format!(
        "the host's lock directory {} has mode {:o} (owner uid {}), so not every user can \
         take locks in it; make it 0777 (chmod 0777 {0}) or remove it to have it made again, \
         or name a backend with FENCED_BACKEND",
        dir.display(),
        mode & 0o7777,
        meta.uid()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_default_file_is_in_run_lock_only_where_every_user_may_write_it() {
        let dir = tempfile::tempdir().unwrap();
        let run_lock = dir.path().join("lock");
        std::fs::create_dir(&run_lock).unwrap();
        for (mode, expected) in [
            (0o1777, run_lock.join("fenced/locks.db")),
            (0o755, PathBuf::from("/var/tmp/fenced/locks.db")),
            (0o777, PathBuf::from("/var/tmp/fenced/locks.db")),
        ] {
            std::fs::set_permissions(&run_lock, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(
                default_sqlite_path_given(&run_lock),
                expected,
                "mode {mode:o}"
            );
        }
        let missing = dir.path().join("none");
        assert_eq!(
            default_sqlite_path_given(&missing),
            PathBuf::from("/var/tmp/fenced/locks.db")
        );
    }

    #[test]
    fn the_shared_directory_is_made_open_to_all_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("fenced");
        make_shared_dir(&shared).unwrap();
        let mode = std::fs::metadata(&shared).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o777);
        // Made already: left as it is.
        make_shared_dir(&shared).unwrap();
        // Closed to other users: refused, with the way out.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = make_shared_dir(&shared).unwrap_err();
        assert!(err.to_string().contains("chmod 0777"), "{err}");
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let err = make_shared_dir(&file).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
    }
}
