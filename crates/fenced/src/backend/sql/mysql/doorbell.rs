//! The doorbell: waiters parked in `GET_LOCK` on a lock a second connection holds, woken by `KILL QUERY`.

use super::*;

/// The doorbell: sleeps on the server until a `KILL QUERY` ends the sleep,
/// then wakes this client's waiters of every lock (one at a time where only one
/// can get in; see `spi::wake`). Reconnects if it must.
pub(super) async fn doorbell_loop(
    mut conn: MySqlConnection,
    opts: MySqlConnectOptions,
    bell: Arc<AtomicI64>,
    wakeups: Arc<Wakeups>,
) {
    // The doorbell waits in GET_LOCK on a lock its anchor session holds,
    // not in SLEEP(): every SLEEP() in the server shares one mutex, and a
    // KILL QUERY that finds it taken retries for up to seconds, while a
    // GET_LOCK wait has a mutex of its own.
    let key = format!("fenced_bell:{}", uuid::Uuid::new_v4().simple());
    let mut anchor = None;
    loop {
        if anchor.is_none() {
            anchor = anchored(&opts, &key).await;
        }
        match wait_for_doorbell(&mut conn, &key).await {
            // Rung (the wait was interrupted) or waited an hour.
            Ok(None) | Ok(Some(0)) => {}
            // The anchor session is gone and the doorbell got its lock:
            // give it back and anchor again.
            Ok(Some(_)) => {
                let _ = sqlx::query("SELECT RELEASE_LOCK(?)")
                    .bind(&key)
                    .execute(&mut conn)
                    .await;
                anchor = None;
            }
            Err(e) => {
                tracing::debug!(error = %e, "MySQL doorbell lost its connection");
                wakeups.wake_each();
                conn = reconnect(&opts).await;
                match doorbell_id(&mut conn).await {
                    Ok(id) => bell.store(id, Ordering::Release),
                    Err(_) => continue,
                }
            }
        }
        wakeups.wake_each();
    }
}

/// A session holding the doorbell's lock, or `None` if none could open.
pub(super) async fn anchored(opts: &MySqlConnectOptions, key: &str) -> Option<MySqlConnection> {
    let mut c = MySqlConnection::connect_with(opts).await.ok()?;
    let got = sqlx::query("SELECT CAST(GET_LOCK(?, 0) AS SIGNED) AS got")
        .bind(key)
        .fetch_one(&mut c)
        .await
        .and_then(|r| r.try_get::<Option<i64>, _>("got"));
    matches!(got, Ok(Some(1))).then_some(c)
}

/// Waits for a wake-up: `Ok(None)` when rung, `Ok(Some(1))` when the anchor
/// is gone, `Ok(Some(0))` after an hour, `Err` if the connection failed.
pub(super) async fn wait_for_doorbell(
    conn: &mut MySqlConnection,
    key: &str,
) -> std::result::Result<Option<i64>, sqlx::Error> {
    let got = sqlx::query("SELECT CAST(GET_LOCK(?, 3600) AS SIGNED) AS got")
        .bind(key)
        .fetch_one(&mut *conn)
        .await
        .and_then(|r| r.try_get::<Option<i64>, _>("got"));
    match got {
        Ok(g) => Ok(g),
        // MariaDB reports a wake-up as "query execution was interrupted";
        // the connection is fine then.
        Err(e) => match sqlx::query("SELECT 1").execute(&mut *conn).await {
            Ok(_) => Ok(None),
            Err(_) => Err(e),
        },
    }
}

/// Marks `conn` as a doorbell (see the module docs); its connection id.
pub(super) async fn doorbell_id(
    conn: &mut MySqlConnection,
) -> std::result::Result<i64, sqlx::Error> {
    sqlx::query(DOORBELL_MARK).execute(&mut *conn).await?;
    sqlx::query("SELECT CAST(CONNECTION_ID() AS SIGNED) AS id")
        .fetch_one(conn)
        .await
        .and_then(|r| r.try_get::<i64, _>("id"))
}

pub(super) async fn reconnect(opts: &MySqlConnectOptions) -> MySqlConnection {
    let mut pause = Duration::from_millis(100);
    loop {
        match MySqlConnection::connect_with(opts).await {
            Ok(c) => return c,
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}
