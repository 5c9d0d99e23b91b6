//! SQLite beyond the conformance suite: the lock file's disk full, and
//! the lock file kept small.

#![cfg(feature = "sqlite")]

use fenced_testkit::Timing;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A small file system of its own (tmpfs), unmounted when dropped.
struct Mounted(PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl Mounted {
    fn tmpfs(size: &str) -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount a {size} tmpfs at {}", dir.path().display());
        Mounted(dir.path().to_owned(), dir)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes `path` until the file system has no byte left.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0xa5u8; 4096];
    loop {
        match f.write_all(&block).and_then(|_| f.sync_data()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc_enospc()) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // The last partial block, byte by byte.
    while f.write_all(&[0]).and_then(|_| f.sync_data()).is_ok() {}
}

fn libc_enospc() -> i32 {
    nix::errno::Errno::ENOSPC as i32
}

/// The lock file's disk fills up: calls fail with an error that says so
/// (no panic, no hang), a failed call leaves nothing held, and once space
/// frees the same clients take and release locks again, with nothing left
/// held. It found that one failed write poisoned a pooled connection for
/// good (every later call: "non-zero transaction depth"). Needs root, for
/// the small file system it fills (CI runs as root).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_an_error_and_the_lock_file_recovers() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: only root can mount the small file system it fills (CI runs as root)");
        return;
    }
    let t = Timing::default();
    let fs = Mounted::tmpfs("2m");
    let url = format!("sqlite://{}", fs.0.join("locks.db").display());
    let (a, b) = fenced_testkit::two_clients(&url).await;
    let held = a
        .mutex("held")
        .unwrap()
        .lease(t.ms(3000))
        .acquire()
        .await
        .unwrap();
    fill(&fs.0.join("filler"));

    // New names need new pages: sooner or later one cannot be written.
    let mut refused = None;
    for i in 0..5_000 {
        let name = format!("name-{i}-{}", "x".repeat(200));
        match b.mutex(&name).unwrap().try_acquire().await {
            Ok(Some(g)) => {
                // Its release may meet the full disk too; its lease then
                // frees it, as any release that cannot be written.
                let _ = g.release().await;
            }
            Ok(None) => panic!("{name} is free, yet it was refused"),
            Err(e) => {
                refused = Some((name, e));
                break;
            }
        }
    }
    let (name, e) = refused.expect("a full disk refuses a write within 5,000 new names");
    let text = format!("{e:#}");
    assert!(
        text.contains("full"),
        "the error says the disk is full: {text}"
    );

    std::fs::remove_file(fs.0.join("filler")).unwrap();
    // Space again: the refused name is free, the held lock is still
    // exclusive (or was given up with a lost signal), and both release.
    let again = b.mutex(&name).unwrap().try_acquire().await.unwrap();
    assert!(again.is_some(), "the refused try left {name} held");
    assert!(again.unwrap().release().await.unwrap());
    let other = b.mutex("held").unwrap();
    if held.is_held() {
        assert!(other.try_acquire().await.unwrap().is_none());
        assert!(held.release().await.unwrap());
    }
    let g = other
        .acquire_timeout(t.ms(10_000))
        .await
        .unwrap()
        .expect("the lock is taken again once space frees");
    assert!(g.release().await.unwrap());
    for n in ["held", name.as_str()] {
        let s = a.status(n).await.unwrap();
        assert!(s.holders.is_empty(), "{n} is left held: {s:?}");
    }
    a.close().await;
    b.close().await;
}

/// The tokens of names free for a day are forgotten when a client opens
/// the file (and now and then on release), so a lock per order does not
/// grow the file for ever; a name held, or used lately, keeps its token,
/// the highest forgotten is kept as a floor, and a forgotten name's next
/// token is still above its last (`fenced-cli`'s
/// `tokens_still_rise_when_a_forgotten_name_meets_a_clock_stepped_back`
/// steps the clock back too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_names_long_free_are_forgotten_and_tokens_still_rise() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let url = format!("sqlite://{}", path.display());
    let a = fenced::Client::connect(&url).await.unwrap();
    let mut last = Vec::new();
    for n in ["old-1", "old-2", "fresh"] {
        let g = a.mutex(n).unwrap().acquire().await.unwrap();
        last.push(g.fencing_token());
        assert!(g.release().await.unwrap());
    }
    let held = a.mutex("held").unwrap().acquire().await.unwrap();
    // As if their last grants were two days ago.
    let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let two_days_ago = (std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    sqlx::query("UPDATE fenced_tokens SET token = ?1 WHERE name IN ('old-1', 'old-2', 'held')")
        .bind(two_days_ago)
        .execute(&mut db)
        .await
        .unwrap();
    let b = fenced::Client::connect(&url).await.unwrap();
    let kept: Vec<String> = sqlx::query_scalar("SELECT name FROM fenced_tokens ORDER BY name")
        .fetch_all(&mut db)
        .await
        .unwrap();
    // The row '' is the floor: the highest token forgotten.
    assert_eq!(kept, ["", "fresh", "held"], "what the opening client kept");
    let floor: i64 = sqlx::query_scalar("SELECT token FROM fenced_tokens WHERE name = ''")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(floor, two_days_ago);
    let again = b.mutex("old-1").unwrap().acquire().await.unwrap();
    assert!(
        again.fencing_token() > last[0],
        "{} after {}",
        again.fencing_token(),
        last[0]
    );
    assert!(again.release().await.unwrap());
    assert!(held.release().await.unwrap());
    db.close().await.unwrap();
    a.close().await;
    b.close().await;
}

/// A lock file an older fenced made has no `holder` column: the next
/// client to open it adds it, and holds then show who took them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_file_of_an_older_fenced_gains_the_holder_column() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let opts = url.parse::<sqlx::sqlite::SqliteConnectOptions>().unwrap();
    let mut db = sqlx::SqliteConnection::connect_with(&opts.create_if_missing(true))
        .await
        .unwrap();
    // The table as an older fenced made it.
    sqlx::query(
        "CREATE TABLE fenced_holds (hold_id TEXT PRIMARY KEY, name TEXT NOT NULL, \
         owner TEXT NOT NULL, mode INTEGER NOT NULL, take INTEGER NOT NULL, \
         max INTEGER NOT NULL, token INTEGER NOT NULL, expires_ms INTEGER NOT NULL)",
    )
    .execute(&mut db)
    .await
    .unwrap();
    let a = fenced::Client::connect(&url).await.unwrap();
    let columns: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_table_info('fenced_holds')")
            .fetch_all(&mut db)
            .await
            .unwrap();
    assert!(columns.iter().any(|c| c == "holder"), "{columns:?}");
    let g = a.mutex("n").unwrap().acquire().await.unwrap();
    let who = a.status("n").await.unwrap().holders[0].holder.clone();
    assert_eq!(who.expect("a holder recorded").pid, std::process::id());
    assert!(g.release().await.unwrap());
}
