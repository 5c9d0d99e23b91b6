//! MariaDB beyond the conformance suite: killed connections, names that
//! look like SQL, bad URLs.

#![cfg(feature = "mysql")]

use fenced::{Client, ErrorKind};
use fenced_testkit::servers::mariadb::MariaDb;
use fenced_testkit::{Timing, unique};
use std::time::Duration;

/// A lease-table hold belongs to no connection: killing the holder's
/// connections (doorbell included) keeps it, renewals go on over new ones,
/// and nobody else gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_survive_killed_connections() {
    let t = Timing::default();
    let server = MariaDb::start();
    let (a, b) = fenced_testkit::two_clients(&server.url()).await;
    let name = unique("mdbkill");
    let g = fenced_testkit::hold(&a, &name, fenced::Lease::Renewed(t.ms(3000))).await;
    let ids = server.sql(
        "SELECT GROUP_CONCAT(id) FROM information_schema.processlist \
         WHERE user = 'root' AND id <> CONNECTION_ID()",
    );
    for id in ids.split(',').filter(|s| !s.is_empty()) {
        let _ = std::process::Command::new("mariadb")
            .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root", "-e"])
            .arg(format!("KILL {id}"))
            .arg(format!("-P{}", server.port))
            .output();
    }
    for _ in 0..4 {
        tokio::time::sleep(t.ms(1000)).await;
        assert!(g.is_held(), "renewals reconnect");
        let lock = b.mutex(&name).unwrap();
        let other = t
            .until_available("MariaDB answers", || lock.try_acquire())
            .await;
        assert!(other.is_none(), "two holders");
    }
    assert!(g.release().await.unwrap());
}

/// Names are data, compared byte for byte: SQL in a name changes nothing
/// but that lock, and names differing only in case or trailing spaces are
/// different locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_exact_data() {
    let server = MariaDb::start();
    let c = Client::connect(&server.url()).await.unwrap();
    fenced_testkit::names_stay_data(
        &c,
        &[
            "x'); DROP TABLE fenced_holds; --",
            "a\" OR 1=1 --",
            "\\' ; `",
            "naïve ключ 🔒",
        ],
    )
    .await;
    let upper = c
        .mutex("Case")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let lower = c.mutex("case").unwrap().try_acquire().await.unwrap();
    let spaced = c.mutex("Case ").unwrap().try_acquire().await.unwrap();
    assert!(
        lower.is_some() && spaced.is_some(),
        "distinct names are distinct locks"
    );
    drop(upper);
    assert_eq!(server.sql("SELECT count(*) FROM fenced_registers"), "4");
}

/// Bad URLs get clear errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls() {
    let server = MariaDb::start();
    let e = Client::connect(&format!("mysql://root@127.0.0.1:{}/nope", server.port))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = Client::connect(&format!("{}?pool=0", server.url()))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = Client::connect(&format!("{}?mode=getlock", server.url()))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

/// `mode=advisory` is `GET_LOCK` on the lock's own name: a plain MariaDB
/// session holding `GET_LOCK(name)` keeps fenced out until it lets go (the
/// server, not a poll, wakes the waiter), fenced's hold keeps the plain
/// session out, and killing the holder's session fires its lost signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_is_get_lock_and_signals_a_killed_session() {
    let t = Timing::default();
    let server = MariaDb::start();
    let url = format!("{}?mode=advisory", server.url());
    let c = Client::connect(&url).await.unwrap();
    let name = unique("mdbadv");
    let plain = std::process::Command::new("mariadb")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root", "-N", "-e"])
        .arg(format!("SELECT GET_LOCK('{name}', 0); SELECT SLEEP(2)"))
        .arg(format!("-P{}", server.port))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    t.wait_until("the plain session holds the lock", || async {
        !c.status(&name).await.unwrap().is_free()
    })
    .await;
    let lock = c.mutex(&name).unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none(), "two holders");
    let g = lock
        .acquire_timeout(t.eventually())
        .await
        .unwrap()
        .expect("the plain session's lock ends with it");
    let out = plain.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().next(),
        Some("1"),
        "the plain session had the lock first"
    );
    let grab = format!("SELECT GET_LOCK('{name}', 0)");
    assert_eq!(server.sql(&grab), "0", "a plain session got a held lock");
    assert!(g.release().await.unwrap());
    assert_eq!(server.sql(&grab), "1");

    let g = lock.clone().lease(t.ms(3000)).acquire().await.unwrap();
    let id = server.sql(&format!("SELECT IS_USED_LOCK('{name}')"));
    server.sql(&format!("KILL {id}"));
    let reason = tokio::time::timeout(t.eventually(), g.lost())
        .await
        .expect("lost() must fire");
    assert_eq!(reason, fenced::LostReason::Taken);
    let next = lock.try_acquire().await.unwrap().expect("the lock is free");
    assert!(next.fencing_token() > g.fencing_token());
    assert!(next.release().await.unwrap());
}

/// A holder whose machine goes dark (no close, no reset: its link drops
/// every segment) gives the lock up within about its lease, with the
/// server's default settings, where the server would otherwise keep its
/// session, and the lock, for its `wait_timeout` (8 hours). The holder is
/// told first: it no longer believes in its hold when the next one is
/// granted.
///
/// The lease is short so that the test is (the next test takes the
/// default); the server's settings are its defaults. Needs root, for
/// `iptables` (CI runs as root).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_a_holder_gone_dark_frees_the_lock_after_its_lease() {
    gone_dark(Some(Timing::default().ms(2000))).await;
}

/// The same at the client's default lease (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_a_holder_gone_dark_frees_the_lock_after_the_default_lease() {
    gone_dark(None).await;
}

async fn gone_dark(lease: Option<Duration>) {
    let server = MariaDb::start();
    let url = format!("{}?mode=advisory", server.url());
    fenced_testkit::dark_link::a_dark_holder_gives_way(&url, server.port, lease, |name| {
        // HOST is `127.0.0.1:<port>` (the server resolves no names).
        let host = server.sql(&format!(
            "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK('{name}')"
        ));
        host.rsplit_once(':')
            .map(|(_, p)| p.to_owned())
            .unwrap_or(host)
    })
    .await;
}

/// A session that held a lock has a `wait_timeout` of the lease and a
/// second; kept idle, it is closed with a goodbye before the server ends
/// it, which the server would count (`Aborted_clients`) and log as an
/// aborted connection each time; and so it is at the client's close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_idle_sessions_are_closed_not_aborted() {
    let t = Timing::default();
    let server = MariaDb::start();
    let aborted = || server.sql("SHOW GLOBAL STATUS LIKE 'Aborted_clients'");
    let before = aborted();
    let c = Client::connect(&format!("{}?mode=advisory", server.url()))
        .await
        .unwrap();
    let g = fenced_testkit::hold(&c, &unique("idle"), fenced::Lease::Renewed(t.ms(1000))).await;
    assert!(g.release().await.unwrap());
    // The session's wait_timeout is 2 s (scaled): the server would have
    // ended it by now.
    tokio::time::sleep(t.ms(3000)).await;
    assert_eq!(aborted(), before, "the server ended an idle session");
    // A session kept idle at the close says goodbye too.
    let g = fenced_testkit::hold(&c, &unique("idle"), fenced::Lease::Renewed(t.ms(1000))).await;
    assert!(g.release().await.unwrap());
    c.close().await;
    assert_eq!(aborted(), before, "the close dropped an idle session");
}

/// Each grant runs `READ COMMITTED` on its own connection, serialised on
/// the name's row, so the server's default isolation changes nothing:
/// exclusion and permit counts hold under `REPEATABLE READ` (MariaDB's
/// default) and `SERIALIZABLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_holds_under_any_default_isolation() {
    let server = MariaDb::start();
    for iso in ["REPEATABLE READ", "SERIALIZABLE"] {
        server.sql(&format!("SET GLOBAL TRANSACTION ISOLATION LEVEL {iso}"));
        assert_eq!(
            server.sql("SELECT @@GLOBAL.tx_isolation"),
            iso.replace(' ', "-")
        );
        let fx = fenced_testkit::Fixture::new(server.url(), None, Vec::new());
        fenced_testkit::conformance::mutual_exclusion_tasks(&fx).await;
        fenced_testkit::conformance::semaphore_never_exceeds_permits(&fx).await;
    }
}

/// The one-round-trip grant is a function fenced creates with its tables.
/// A client whose function was dropped under it and a role that may not
/// create it still acquire (by the full transaction) and stay exclusive;
/// a role that did not create it uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_grant_function_acquires_take_the_transaction() {
    let server = MariaDb::start();
    let exists = || {
        server.sql(
            "SELECT COUNT(*) FROM information_schema.ROUTINES \
             WHERE ROUTINE_SCHEMA = 'mysql' AND ROUTINE_NAME = 'fenced_try_grant2'",
        )
    };
    let first = Client::connect(&server.url()).await.unwrap();
    assert_eq!(exists(), "1", "created with the tables");
    server.sql("DROP FUNCTION fenced_try_grant2");
    fenced_testkit::two_holds_in_turn(&first, "nofunction").await;

    // Made again by an administrator's client. `app` may use the tables
    // and create routines, so its `CREATE FUNCTION IF NOT EXISTS` passes
    // and it grants through the administrator's function.
    drop(Client::connect(&server.url()).await.unwrap());
    assert_eq!(exists(), "1");
    server.sql(
        "CREATE USER 'app'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON mysql.fenced_locks TO 'app'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON mysql.fenced_holds TO 'app'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON mysql.fenced_waiters TO 'app'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON mysql.fenced_registers TO 'app'@'127.0.0.1'; \
         GRANT CREATE ROUTINE ON mysql.* TO 'app'@'127.0.0.1'",
    );
    let app_url = server.url().replace("mysql://root@", "mysql://app@");
    let fx = fenced_testkit::Fixture::new(app_url, None, Vec::new());
    fenced_testkit::conformance::mutual_exclusion_tasks(&fx).await;
    assert_eq!(exists(), "1");
    // Now it may not create one either.
    server.sql(
        "REVOKE CREATE ROUTINE ON mysql.* FROM 'app'@'127.0.0.1'; \
         DROP FUNCTION fenced_try_grant2",
    );
    fenced_testkit::conformance::mutual_exclusion_tasks(&fx).await;
    assert_eq!(exists(), "0", "the role could not create it");
}

/// A waiter's row names its doorbell's connection id, and ids start again
/// from 1 when the server restarts while the rows survive it: a release
/// must never `KILL QUERY` a connection that is not a doorbell. Here a
/// waiter's row names an ordinary session in a 3 s `SLEEP`: the release
/// rings nobody, and the sleep ends on its own (`SLEEP` returns 1 when
/// interrupted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_rings_only_doorbells() {
    let server = MariaDb::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let name = unique("bell");
    let g = c.mutex(&name).unwrap().acquire().await.unwrap();
    let sleeper = {
        let port = server.port;
        std::thread::spawn(move || {
            let out = std::process::Command::new("mariadb")
                .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root", "-N", "-B"])
                .arg(format!("-P{port}"))
                .args(["-e", "SELECT CONNECTION_ID(); SELECT SLEEP(3)"])
                .output()
                .expect("run mariadb");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    };
    // The sleeper's connection id, from the server's own list.
    let id = loop {
        let id = server
            .sql("SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP%'");
        if !id.is_empty() {
            break id;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    server.sql(&format!(
        "INSERT INTO fenced_waiters (name, fair, bell, expires_ms) VALUES \
         ('{name}', 0, {id}, CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) + 60000)"
    ));
    assert!(g.release().await.unwrap());
    let out = sleeper.join().unwrap();
    assert_eq!(
        out.lines().last(),
        Some("0"),
        "a release rang a connection that is not a doorbell: {out:?}"
    );
}

/// Tables an older fenced made have no `holder` column. A user who may
/// not alter them goes on without it: its locks exclude as before, and its
/// holds show no holder. One who may adds it, and holds then show who took
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_of_an_older_fenced_gain_the_holder_column() {
    let server = MariaDb::start();
    drop(Client::connect(&server.url()).await.unwrap());
    // The layout an older fenced made. `app` may create the tables if
    // missing (fenced asks for them on every connect), not alter them.
    server.sql("ALTER TABLE fenced_holds DROP COLUMN holder");
    server.sql(
        "CREATE USER 'app'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON mysql.fenced_locks TO 'app'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON mysql.fenced_holds TO 'app'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON mysql.fenced_waiters TO 'app'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON mysql.fenced_registers TO 'app'@'127.0.0.1'",
    );
    let has_column = || {
        server.sql(
            "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'mysql' \
             AND TABLE_NAME = 'fenced_holds' AND COLUMN_NAME = 'holder'",
        )
    };
    let app = Client::connect(&server.url().replace("mysql://root@", "mysql://app@"))
        .await
        .unwrap();
    assert_eq!(has_column(), "0", "the user may not add it");
    let g = app.mutex("old").unwrap().acquire().await.unwrap();
    assert_eq!(app.status("old").await.unwrap().holders[0].holder, None);
    fenced_testkit::two_holds_in_turn(&app, "old-turns").await;
    assert!(g.release().await.unwrap());

    let root = Client::connect(&server.url()).await.unwrap();
    assert_eq!(has_column(), "1", "root adds it");
    let g = root.mutex("new").unwrap().acquire().await.unwrap();
    let who = root.status("new").await.unwrap().holders[0].holder.clone();
    assert_eq!(who.expect("a holder recorded").pid, std::process::id());
    assert!(g.release().await.unwrap());
}
