//! PostgreSQL beyond the conformance suite: killed connections, a server
//! restart, injection-shaped names, bad URLs.

#![cfg(feature = "postgres")]

use fenced::{Client, ErrorKind};
use fenced_testkit::servers::postgres::PgServer;
use fenced_testkit::{Timing, unique};
use std::time::Duration;

/// Once the restarted server answers, `b` finds `name` held (`why` if not).
async fn still_held_after_restart(t: &Timing, b: &Client, name: &str, why: &str) {
    let lock_b = b.mutex(name).unwrap();
    let other = t
        .until_available("the restarted server answers", || lock_b.try_acquire())
        .await;
    assert!(other.is_none(), "{why}");
}

/// A lease-table hold belongs to no connection: killing every connection
/// of the holder, or restarting the server for less than a lease, keeps it
/// (the pool reconnects and renewals go on), and nobody else gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_survive_killed_connections_and_a_restart() {
    let t = Timing::default();
    let mut server = PgServer::start();
    let (a, b) = fenced_testkit::two_clients(&server.url()).await;
    let name = unique("pgkill");
    let g = fenced_testkit::hold(&a, &name, fenced::Lease::Renewed(t.ms(3000))).await;
    let killed = server.sql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE pid <> pg_backend_pid() AND datname = 'postgres'",
    );
    assert!(killed.parse::<u32>().unwrap() >= 2, "killed {killed}");
    // Longer than the lease: only renewals over new connections keep it.
    for _ in 0..4 {
        tokio::time::sleep(t.ms(1000)).await;
        assert!(g.is_held(), "renewals reconnect");
        let other = b.mutex(&name).unwrap().try_acquire().await;
        assert!(matches!(other, Ok(None)), "{other:?}");
    }
    server.restart();
    tokio::time::sleep(t.ms(1000)).await;
    still_held_after_restart(
        &t,
        &b,
        &name,
        "the hold is in the table and survives a restart",
    )
    .await;
    assert!(g.is_held());
    assert!(g.release().await.unwrap());
}

/// Names are data: quotes, semicolons and SQL in a lock name change
/// nothing but that lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injection_shaped_names_stay_data() {
    let server = PgServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    fenced_testkit::names_stay_data(
        &c,
        &[
            "x'); DROP TABLE fenced_holds; --",
            "a\" OR 1=1 --",
            "$1 $$ \\ ' ;",
            "naïve ключ 🔒",
        ],
    )
    .await;
    assert_eq!(server.sql("SELECT count(*) FROM fenced_holds"), "0");
    assert_eq!(server.sql("SELECT count(*) FROM fenced_locks"), "4");
}

/// Bad URLs and unreachable servers get clear errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unreachable_servers() {
    let server = PgServer::start();
    let no_db = format!("postgres://postgres@127.0.0.1:{}/nope", server.port);
    let e = Client::connect(&no_db).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let bad_pool = format!("{}?pool=0", server.url());
    let e = Client::connect(&bad_pool).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("pool"), "{e}");
    let nobody = fenced_testkit::servers::free_port();
    let e = tokio::time::timeout(
        Duration::from_secs(60),
        Client::connect(&format!("postgres://postgres@127.0.0.1:{nobody}/postgres")),
    )
    .await
    .expect("connect must give up")
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

/// `mode=advisory`: killing the holder's session frees the lock on the
/// server at once, and the holder's renewal notices and fires its lost
/// signal. Keys follow the documented derivation (FNV-1a 64 of the name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_session_killed_fires_the_lost_signal() {
    let t = Timing::default();
    let server = PgServer::start();
    let url = format!("{}?mode=advisory", server.url());
    let (a, b) = fenced_testkit::two_clients(&url).await;
    let name = unique("adv");
    let g = fenced_testkit::hold(&a, &name, fenced::Lease::Renewed(t.ms(900))).await;
    let held = server.sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted");
    assert_eq!(held, "1");
    let killed = server.sql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_locks \
         WHERE locktype = 'advisory' AND granted",
    );
    assert_eq!(killed, "1");
    let reason = tokio::time::timeout(t.eventually(), g.lost())
        .await
        .expect("the renewal sees the dead session");
    assert_eq!(reason, fenced::LostReason::Taken);
    let g2 = b
        .mutex(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the server freed the lock with the session");
    assert!(g2.fencing_token() > g.fencing_token());
    let e = b
        .semaphore(&name, 2)
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

/// A holder whose machine goes dark (no close, no reset: its link drops
/// every segment) gives the lock up within about its lease, with the
/// server's default TCP settings, where the server would otherwise keep
/// its session, and the lock, for over two hours (the kernel's keepalive
/// defaults). The holder is told first: it no longer believes in its
/// hold when the next one is granted.
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
    let server = PgServer::start();
    let url = format!("{}?mode=advisory", server.url());
    fenced_testkit::dark_link::a_dark_holder_gives_way(&url, server.port, lease, |_| {
        server.sql(
            "SELECT a.client_port FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted",
        )
    })
    .await;
}

/// Grants serialise on the name's row in an explicit `READ COMMITTED`
/// transaction, so a server whose default isolation is stricter changes
/// nothing: exclusion and permit counts hold under `REPEATABLE READ` and
/// `SERIALIZABLE` defaults too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_holds_under_stricter_default_isolation() {
    for iso in ["repeatable read", "serializable"] {
        // A server each: the two suites' clients, dozens of pooled
        // connections, would not all close before the next level's open,
        // and PostgreSQL takes 100 connections by default.
        let server = PgServer::start();
        server.sql(&format!(
            "ALTER DATABASE postgres SET default_transaction_isolation = '{iso}'"
        ));
        assert_eq!(server.sql("SHOW default_transaction_isolation"), iso);
        let fx = fenced_testkit::Fixture::new(server.url(), None, Vec::new());
        fenced_testkit::conformance::mutual_exclusion_tasks(&fx).await;
        fenced_testkit::conformance::semaphore_never_exceeds_permits(&fx).await;
    }
}

/// The one-round-trip grant is a function fenced creates with its tables.
/// A client whose function was dropped under it, and a role that may not
/// create functions, still acquire (by the full transaction) and stay
/// exclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_grant_function_acquires_take_the_transaction() {
    const FUNCTION: &str =
        "fenced_try_grant2(text, text, text, smallint, integer, integer, double precision, text)";
    let server = PgServer::start();
    let first = Client::connect(&server.url()).await.unwrap();
    let exists = || server.sql(&format!("SELECT to_regprocedure('{FUNCTION}') IS NOT NULL"));
    assert_eq!(exists(), "t", "created with the tables");
    server.sql(&format!("DROP FUNCTION {FUNCTION}"));
    fenced_testkit::two_holds_in_turn(&first, "nofunction").await;

    server.sql(
        "CREATE ROLE app LOGIN; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON fenced_locks, fenced_holds, fenced_waiters, \
         fenced_registers TO app; \
         GRANT USAGE ON SEQUENCE fenced_waiters_ticket_seq TO app; \
         REVOKE CREATE ON SCHEMA public FROM PUBLIC",
    );
    let app_url = server
        .url()
        .replace("postgres://postgres@", "postgres://app@");
    let fx = fenced_testkit::Fixture::new(app_url.clone(), None, Vec::new());
    fenced_testkit::conformance::mutual_exclusion_tasks(&fx).await;
    assert_eq!(exists(), "f", "the role could not create it");
    // Nor the function that keeps advisory waits out of the log: its
    // waiters wait with the bare call.
    let fx = fenced_testkit::Fixture::new(format!("{app_url}?mode=advisory"), None, Vec::new());
    fenced_testkit::conformance::mutual_exclusion_tasks(&fx).await;
    assert_eq!(
        server.sql("SELECT to_regprocedure('fenced_advisory_wait(bigint, boolean)') IS NULL"),
        "t"
    );

    // Where the tables are missing and the role may not create them, the
    // error says what to do.
    server.sql("CREATE DATABASE bare");
    let bare = server
        .url()
        .replace("postgres://postgres@", "postgres://app@")
        .replace("/postgres", "/bare");
    let e = Client::connect(&bare).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("PostgreSQL layout"), "{e}");
}

/// A server that acknowledges commits before writing them
/// (`synchronous_commit = off`) would forget the last grants and token
/// raises when it crashes, and the lock would go to two holders. fenced's
/// own sessions commit synchronously whatever the server's default, so a
/// hold and a token survive a crash right after they were granted. The
/// WAL writer is slowed to 10 s so that nothing else writes the grant out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_survive_a_crash_under_asynchronous_commit() {
    let t = Timing::default();
    let mut server = PgServer::start();
    // The tables exist (durably) before the setting changes, so what a
    // crash could lose is the grant itself.
    drop(Client::connect(&server.url()).await.unwrap());
    server.sql("ALTER SYSTEM SET wal_writer_delay = '10s'");
    server.sql("SELECT pg_reload_conf()");
    server.sql("ALTER DATABASE postgres SET synchronous_commit = off");
    assert_eq!(server.sql("SHOW synchronous_commit"), "off");
    let advisory_url = format!("{}?mode=advisory", server.url());
    let (a, b, adv) = (
        Client::connect(&server.url()).await.unwrap(),
        Client::connect(&server.url()).await.unwrap(),
        Client::connect(&advisory_url).await.unwrap(),
    );
    let (name, adv_name) = (unique("asynccommit"), unique("asynctoken"));
    let adv_guard = adv.mutex(&adv_name).unwrap().acquire().await.unwrap();
    let adv_token = adv_guard.fencing_token();
    let g = fenced_testkit::hold(&a, &name, fenced::Lease::Renewed(t.ms(8000))).await;
    server.kill();
    drop(adv_guard);
    server.restart();
    still_held_after_restart(
        &t,
        &b,
        &name,
        "the grant acknowledged before the crash was forgotten",
    )
    .await;
    let adv_lock = adv.mutex(&adv_name).unwrap();
    let again = t
        .until_available("the advisory client reconnects", || adv_lock.try_acquire())
        .await
        .expect("nobody holds the advisory lock after the restart");
    assert!(
        again.fencing_token() > adv_token,
        "the token raised before the crash was forgotten: {} after {adv_token}",
        again.fencing_token()
    );
    assert!(again.release().await.unwrap());
    assert!(g.release().await.unwrap());
}

/// `pool=1`: one pooled connection is enough for grants, releases and
/// renewals; the listener for NOTIFY has a connection of its own (it took
/// the pool's only one, and every grant waited for it for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pooled_connection_is_enough() {
    let t = Timing::default();
    let server = PgServer::start();
    let c = Client::connect(&format!("{}?pool=1", server.url()))
        .await
        .unwrap();
    let name = unique("pool1");
    let g = tokio::time::timeout(t.eventually(), c.mutex(&name).unwrap().acquire())
        .await
        .expect("a grant with one pooled connection")
        .unwrap();
    assert!(!c.status(&name).await.unwrap().is_free());
    assert!(g.release().await.unwrap());
}

/// Tables an older fenced made have no `holder` column. A role that may
/// not alter them goes on without it: its locks exclude as before, and its
/// holds show no holder. The tables' owner adds it, and holds then show
/// who took them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_of_an_older_fenced_gain_the_holder_column() {
    let server = PgServer::start();
    drop(Client::connect(&server.url()).await.unwrap());
    // The layout an older fenced made.
    server.sql("ALTER TABLE fenced_holds DROP COLUMN holder");
    server.sql(
        "CREATE ROLE app LOGIN; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON fenced_locks, fenced_holds, fenced_waiters, \
         fenced_registers TO app; \
         GRANT USAGE ON SEQUENCE fenced_waiters_ticket_seq TO app",
    );
    let has_column = || {
        server.sql(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'fenced_holds'::regclass \
             AND attname = 'holder' AND NOT attisdropped",
        )
    };
    let app_url = server
        .url()
        .replace("postgres://postgres@", "postgres://app@");
    let app = Client::connect(&app_url).await.unwrap();
    assert_eq!(has_column(), "0", "the role may not add it");
    let g = app.mutex("old").unwrap().acquire().await.unwrap();
    assert_eq!(app.status("old").await.unwrap().holders[0].holder, None);
    fenced_testkit::two_holds_in_turn(&app, "old-turns").await;
    assert!(g.release().await.unwrap());

    let owner = Client::connect(&server.url()).await.unwrap();
    assert_eq!(has_column(), "1", "the owner adds it");
    let g = owner.mutex("new").unwrap().acquire().await.unwrap();
    let who = owner.status("new").await.unwrap().holders[0].holder.clone();
    assert_eq!(who.expect("a holder recorded").pid, std::process::id());
    assert!(g.release().await.unwrap());
}

/// A release that a queued waiter can use names the queue's head first
/// (`\x02<ticket>:<name>`, so only the head's process looks), then the
/// bare name, in one transaction: a client of an older fenced listens for
/// the bare name alone and must still hear it. Unfair waiters queue too,
/// so status counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_names_the_head_then_the_bare_name() {
    let t = Timing::default();
    let server = PgServer::start();
    let (a, b) = fenced_testkit::two_clients(&server.url()).await;
    let name = unique("herd");
    let g = a.mutex(&name).unwrap().acquire().await.unwrap();
    let waiter = tokio::spawn({
        let m = b.mutex(&name).unwrap();
        async move { m.acquire().await }
    });
    t.wait_until("the unfair waiter takes a queue place", || async {
        a.status(&name).await.unwrap().waiters == 1
    })
    .await;
    let mut listener = sqlx::postgres::PgListener::connect(&server.url())
        .await
        .unwrap();
    listener.listen("fenced_wake").await.unwrap();
    assert!(g.release().await.unwrap());
    let mut heard = Vec::new();
    while heard.len() < 2 {
        let n = tokio::time::timeout(t.eventually(), listener.recv())
            .await
            .expect("the release's notifications")
            .unwrap();
        heard.push((n.process_id(), n.payload().to_owned()));
    }
    let (head, bare) = (&heard[0], &heard[1]);
    let ticket = head
        .1
        .strip_prefix('\u{2}')
        .and_then(|p| p.strip_suffix(&format!(":{name}")))
        .unwrap_or_else(|| panic!("the head first: {heard:?}"));
    assert!(ticket.parse::<i64>().unwrap() > 0, "{heard:?}");
    assert_eq!(bare.1, name, "then the bare name: {heard:?}");
    assert_eq!(head.0, bare.0, "from one transaction: {heard:?}");
    let g = tokio::time::timeout(t.eventually(), waiter)
        .await
        .expect("the head is woken")
        .unwrap()
        .unwrap();
    assert_eq!(
        a.status(&name).await.unwrap().waiters,
        0,
        "its place withdrawn"
    );
    assert!(g.release().await.unwrap());
}

/// The advisory locks not granted in the server's queue now.
fn queued_in_server(server: &PgServer) -> String {
    server.sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
}

/// A server, its two clients, the lock's name, the first's hold and the
/// second's waiting `acquire`.
type HeldWithAWaiter = (
    PgServer,
    (fenced::Client, fenced::Client),
    String,
    fenced::Guard,
    tokio::task::JoinHandle<fenced::Result<fenced::Guard>>,
);

/// A server, two clients in `mode=advisory`, a lock named from `prefix`
/// held by the first, and the second's `acquire` of it waiting in the
/// server's queue.
async fn held_with_a_waiter_in_the_server(t: &Timing, prefix: &str) -> HeldWithAWaiter {
    held_with_a_waiter_in_the_server_after(t, prefix, |_| ()).await
}

/// [`held_with_a_waiter_in_the_server`], with `meanwhile` run on the
/// server once the clients are open, before the lock is taken.
async fn held_with_a_waiter_in_the_server_after(
    t: &Timing,
    prefix: &str,
    meanwhile: impl FnOnce(&PgServer),
) -> HeldWithAWaiter {
    let server = PgServer::start();
    let url = format!("{}?mode=advisory", server.url());
    let (a, b) = fenced_testkit::two_clients(&url).await;
    meanwhile(&server);
    let name = unique(prefix);
    let g = a.mutex(&name).unwrap().acquire().await.unwrap();
    let waiter = tokio::spawn({
        let m = b.mutex(&name).unwrap();
        async move { m.acquire().await }
    });
    t.wait_until("the waiter waits in the server's queue", || async {
        queued_in_server(&server) == "1"
    })
    .await;
    (server, (a, b), name, g, waiter)
}

/// Releases `g`, whose lock `waiter` waits for in the server: the server
/// grants the waiter, with a higher token, and it releases in turn.
async fn handed_over(
    t: &Timing,
    g: fenced::Guard,
    waiter: tokio::task::JoinHandle<fenced::Result<fenced::Guard>>,
) {
    let first = g.fencing_token();
    assert!(g.release().await.unwrap());
    let g2 = tokio::time::timeout(t.eventually(), waiter)
        .await
        .expect("the server grants the waiter")
        .unwrap()
        .unwrap();
    assert!(g2.fencing_token() > first);
    assert!(g2.release().await.unwrap());
}

/// `mode=advisory`, at the defaults: a waiter waits in the server's own
/// queue, so the release hands the lock over there; a release that hands
/// it over wakes no one, and one that leaves it free wakes the listeners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_waiters_wait_in_the_server_and_a_hand_over_wakes_no_one() {
    let t = Timing::default();
    let (server, _clients, name, g, waiter) =
        held_with_a_waiter_in_the_server(&t, "adv-queue").await;
    let mut listener = sqlx::postgres::PgListener::connect(&server.url())
        .await
        .unwrap();
    listener.listen("fenced_wake").await.unwrap();
    handed_over(&t, g, waiter).await;
    // Notifications arrive in commit order: everything before the end
    // mark is the two releases'.
    let end = unique("end-mark");
    server.sql(&format!("NOTIFY fenced_wake, '{end}'"));
    let mut heard = Vec::new();
    loop {
        let n = tokio::time::timeout(t.eventually(), listener.recv())
            .await
            .expect("the end mark")
            .unwrap();
        if n.payload() == end {
            break;
        }
        heard.push(n.payload().to_owned());
    }
    assert_eq!(
        heard,
        vec![name.clone()],
        "the hand-over woke no one, the release that left the lock free did"
    );
}

/// `mode=advisory`, at the server's default logging: a waiter whose
/// waits in the server run out (every 2 s) leaves no error in the
/// server's log, where each used to log "canceling statement due to lock
/// timeout" with the statement's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_waits_that_run_out_log_no_error() {
    let t = Timing::default();
    let (server, _clients, _name, g, waiter) =
        held_with_a_waiter_in_the_server(&t, "adv-quiet").await;
    let waiting_since = || {
        server.sql(
            "SELECT coalesce(max(query_start)::text, '') FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'",
        )
    };
    // Two waits run out and the waiter waits again each time.
    for _ in 0..2 {
        let first = waiting_since();
        let wait = tokio::time::Instant::now() + Duration::from_secs(20);
        while waiting_since() == first || waiting_since().is_empty() {
            assert!(
                tokio::time::Instant::now() < wait,
                "the waiter waits again after its wait in the server ran out"
            );
            tokio::time::sleep(t.ms(50)).await;
        }
    }
    handed_over(&t, g, waiter).await;
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(
        !log.contains("ERROR"),
        "the server logged errors while a waiter waited:\n{log}"
    );
}

/// `mode=advisory`: the function that keeps waits out of the log, dropped
/// under live clients; their waits go on with the bare call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_waits_outlive_their_function() {
    const FUNCTION: &str = "fenced_advisory_wait(bigint, boolean)";
    let t = Timing::default();
    let dropped = |server: &PgServer| {
        let present = format!("SELECT to_regprocedure('{FUNCTION}') IS NOT NULL");
        assert_eq!(server.sql(&present), "t", "made when the clients opened");
        server.sql(&format!("DROP FUNCTION {FUNCTION}"));
    };
    let (server, _clients, _name, g, waiter) =
        held_with_a_waiter_in_the_server_after(&t, "adv-nofunction", dropped).await;
    handed_over(&t, g, waiter).await;
    let present = format!("SELECT to_regprocedure('{FUNCTION}') IS NOT NULL");
    assert_eq!(server.sql(&present), "f");
}

/// `mode=advisory`: a waiter whose caller goes away while it waits in the
/// server's queue leaves it, and a grant that came to it anyway is given
/// back: the lock ends up free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_a_waiter_dropped_in_the_server_queue_leaves_nothing() {
    let t = Timing::default();
    let (server, (a, _b), name, g, waiter) = held_with_a_waiter_in_the_server(&t, "adv-drop").await;
    let first = g.fencing_token();
    waiter.abort();
    // Released while the dropped try may still wait: the server may grant
    // it, and its cleanup then gives it back.
    assert!(g.release().await.unwrap());
    t.wait_until("the server's queue empties", || async {
        queued_in_server(&server) == "0"
    })
    .await;
    let m = a.mutex(&name).unwrap();
    let again = std::sync::Mutex::new(None);
    t.wait_until("the lock comes free", || async {
        let got = m.try_acquire().await.unwrap();
        let free = got.is_some();
        *again.lock().unwrap() = got;
        free
    })
    .await;
    let again = again.into_inner().unwrap().unwrap();
    assert!(again.fencing_token() > first);
}

/// `mode=advisory`: a writer takes read beside its write (a downgrade)
/// while another client's writer waits in the server's queue. A `try` on
/// the writer's session fails behind a queued request; the lock request
/// it makes instead is granted at once, since the session holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_a_downgrade_passes_a_waiter_queued_in_the_server() {
    let t = Timing::default();
    let server = PgServer::start();
    let url = format!("{}?mode=advisory", server.url());
    let (a, b) = fenced_testkit::two_clients(&url).await;
    let name = unique("adv-down");
    let me = fenced::Owner::new();
    let rw = a.rwlock(&name).unwrap();
    let w = rw.write().owner(&me).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let m = b.rwlock(&name).unwrap();
        async move { m.write().acquire().await }
    });
    t.wait_until("the other writer waits in the server's queue", || async {
        queued_in_server(&server) == "1"
    })
    .await;
    let r = tokio::time::timeout(t.eventually(), rw.read().owner(&me).acquire())
        .await
        .expect("the downgrade is not held up by the queued writer")
        .unwrap();
    assert!(w.release().await.unwrap());
    assert!(!waiter.is_finished(), "the owner still reads");
    // The queued writer gets the lock.
    handed_over(&t, r, waiter).await;
}

/// `mode=advisory`: more tasks of one client wait than it waits for in
/// the server at once; while the lock changes hands steadily, each still
/// gets its turn (those beyond the server's queue once waited for a
/// notification that a hand-over inside the server never sends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_every_task_of_one_client_gets_its_turn() {
    let t = Timing::default();
    let server = PgServer::start();
    let url = format!("{}?mode=advisory", server.url());
    let client = fenced::Client::connect(&url).await.unwrap();
    let name = unique("adv-turns");
    const TASKS: usize = 16;
    let served = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (m, served) = (client.mutex(&name).unwrap(), served.clone());
            tokio::spawn(async move {
                // Everyone goes on taking the lock until each has had it.
                while served.lock().unwrap().len() < TASKS {
                    let g = m.acquire().await.unwrap();
                    served.lock().unwrap().insert(i);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    assert!(g.release().await.unwrap());
                }
            })
        })
        .collect();
    tokio::time::timeout(t.eventually(), futures_util::future::join_all(tasks))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "tasks never served while the others went on: {:?}",
                (0..TASKS)
                    .filter(|i| !served.lock().unwrap().contains(i))
                    .collect::<Vec<_>>()
            )
        })
        .into_iter()
        .for_each(|r| r.unwrap());
}
