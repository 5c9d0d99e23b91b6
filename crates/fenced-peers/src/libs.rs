//! The libraries compared, each behind one lock/unlock interface, used
//! the way its own documentation shows, with its defaults unless a row
//! says it is tuned.

use anyhow::{Context, Result, bail};
use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use std::time::Duration;

/// The lease rslock and the raw loop take (fenced keeps its default 30 s
/// lease with the watchdog, distributed-lock-redis its default 30 s lease
/// renewed every 10 s).
pub(crate) const LEASE: Duration = Duration::from_secs(10);

/// The engine a library runs on: its limit is the yardstick of its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    Redis,
    Postgres,
}

/// One row of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Lib {
    /// fenced, default options (Redisson layout, 30 s lease, watchdog).
    Fenced,
    /// rslock 0.10 with its default retry (3 tries, up to 200 ms apart).
    Rslock,
    /// rslock 0.10 retrying after 0 or 1 ms (its pause is drawn from
    /// `0..delay` whole milliseconds: a 2 ms delay).
    RslockTuned,
    /// distributed-lock-redis 0.2, `try_acquire` again at once.
    Dlr,
    /// distributed-lock-redis 0.2, `try_acquire` again after 1 ms.
    Dlr1ms,
    /// `SET NX PX` and a compare-and-delete `EVALSHA`, retried every 1 ms.
    Raw,
    /// fenced on PostgreSQL, default (lease table).
    FencedPg,
    /// fenced on PostgreSQL, `mode=advisory` (session advisory locks).
    FencedPgAdvisory,
    /// distributed-lock-postgres 0.2 (session advisory locks).
    DlPg,
}

impl Lib {
    pub(crate) const ALL: [Lib; 9] = [
        Lib::Fenced,
        Lib::Rslock,
        Lib::RslockTuned,
        Lib::Dlr,
        Lib::Dlr1ms,
        Lib::Raw,
        Lib::FencedPg,
        Lib::FencedPgAdvisory,
        Lib::DlPg,
    ];

    pub(crate) fn engine(self) -> Engine {
        match self {
            Lib::FencedPg | Lib::FencedPgAdvisory | Lib::DlPg => Engine::Postgres,
            _ => Engine::Redis,
        }
    }

    /// The row's name in tables and plots.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Lib::Fenced => "fenced",
            Lib::Rslock => "rslock (default retry)",
            Lib::RslockTuned => "rslock (0–1 ms retry)",
            Lib::Dlr => "distributed-lock-redis (retry at once)",
            Lib::Dlr1ms => "distributed-lock-redis (1 ms retry)",
            Lib::Raw => "raw SET NX PX + EVALSHA (1 ms retry)",
            Lib::FencedPg => "fenced (lease table)",
            Lib::FencedPgAdvisory => "fenced (mode=advisory)",
            Lib::DlPg => "distributed-lock-postgres",
        }
    }

    /// The value clap knows it by.
    pub(crate) fn arg(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .expect("no variant is skipped")
            .get_name()
            .to_owned()
    }
}

/// The compare-and-delete every Redis peer releases with.
const CAD: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// A connected library.
pub(crate) enum Locker {
    Fenced(fenced::Client),
    Rslock(rslock::LockManager),
    Dlr {
        provider: distributed_lock_redis::RedisLockProvider,
        pause: Option<Duration>,
    },
    Raw {
        conn: redis::aio::MultiplexedConnection,
        release: redis::Script,
    },
    DlPg(distributed_lock_postgres::PostgresLockProvider),
}

/// A lock held through one of them.
pub(crate) enum Held {
    Fenced(fenced::Guard),
    Rslock(rslock::Lock),
    Dlr(distributed_lock_redis::RedisLockHandle),
    Raw { key: String, token: String },
    DlPg(distributed_lock_postgres::handle::PostgresLockHandle),
}

impl Locker {
    /// Connects `lib` to `url` (a `redis://` or `postgres://` URL).
    pub(crate) async fn connect(lib: Lib, url: &str) -> Result<Locker> {
        Ok(match lib {
            Lib::Fenced | Lib::FencedPg => Locker::Fenced(fenced::Client::connect(url).await?),
            Lib::FencedPgAdvisory => {
                let sep = if url.contains('?') { '&' } else { '?' };
                Locker::Fenced(fenced::Client::connect(&format!("{url}{sep}mode=advisory")).await?)
            }
            Lib::Rslock | Lib::RslockTuned => {
                let mut m = rslock::LockManager::new(vec![url]);
                if lib == Lib::RslockTuned {
                    m.set_retry(3, Duration::from_millis(2));
                }
                Locker::Rslock(m)
            }
            Lib::Dlr | Lib::Dlr1ms => Locker::Dlr {
                provider: distributed_lock_redis::RedisLockProvider::builder()
                    .url(url)
                    .build()
                    .await
                    .map_err(|e| anyhow::anyhow!("distributed-lock-redis: {e}"))?,
                pause: (lib == Lib::Dlr1ms).then_some(Duration::from_millis(1)),
            },
            Lib::Raw => Locker::Raw {
                conn: redis::Client::open(url)?
                    .get_multiplexed_async_connection()
                    .await?,
                release: redis::Script::new(CAD),
            },
            Lib::DlPg => Locker::DlPg(
                distributed_lock_postgres::PostgresLockProvider::builder()
                    .connection_string(url)
                    .build()
                    .await
                    .map_err(|e| anyhow::anyhow!("distributed-lock-postgres: {e}"))?,
            ),
        })
    }

    /// Takes the lock `name`, waiting as the library waits.
    pub(crate) async fn lock(&self, name: &str) -> Result<Held> {
        Ok(match self {
            Locker::Fenced(c) => Held::Fenced(c.mutex(name)?.acquire().await?),
            Locker::Rslock(m) => Held::Rslock(
                m.acquire_no_guard(name.as_bytes(), LEASE)
                    .await
                    .map_err(|e| anyhow::anyhow!("rslock: {e:?}"))?,
            ),
            Locker::Dlr { provider, pause } => {
                let lock = provider.create_lock(name);
                loop {
                    let got = lock
                        .try_acquire()
                        .await
                        .map_err(|e| anyhow::anyhow!("distributed-lock-redis: {e}"))?;
                    if let Some(h) = got {
                        break Held::Dlr(h);
                    }
                    match pause {
                        Some(p) => tokio::time::sleep(*p).await,
                        None => tokio::task::yield_now().await,
                    }
                }
            }
            Locker::Raw { conn, .. } => {
                let token = format!("{:032x}", fastrand::u128(..));
                let mut conn = conn.clone();
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(name)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(LEASE.as_millis() as u64)
                        .query_async(&mut conn)
                        .await?;
                    if set.is_some() {
                        break Held::Raw {
                            key: name.to_owned(),
                            token,
                        };
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Locker::DlPg(p) => Held::DlPg(
                p.create_lock(name)
                    .acquire(None)
                    .await
                    .map_err(|e| anyhow::anyhow!("distributed-lock-postgres: {e}"))?,
            ),
        })
    }

    /// Gives `held` back.
    pub(crate) async fn unlock(&self, held: Held) -> Result<()> {
        match (self, held) {
            (Locker::Fenced(_), Held::Fenced(g)) => {
                if !g.release().await? {
                    bail!("fenced: the lock was no longer held at its release");
                }
            }
            (Locker::Rslock(m), Held::Rslock(l)) => m.unlock(&l).await,
            (Locker::Dlr { .. }, Held::Dlr(h)) => h
                .release()
                .await
                .map_err(|e| anyhow::anyhow!("distributed-lock-redis: {e}"))?,
            (Locker::Raw { conn, release }, Held::Raw { key, token }) => {
                let n: i64 = release
                    .key(&key)
                    .arg(&token)
                    .invoke_async(&mut conn.clone())
                    .await?;
                if n != 1 {
                    bail!("raw: the lock was no longer held at its release");
                }
            }
            (Locker::DlPg(_), Held::DlPg(h)) => h
                .release()
                .await
                .map_err(|e| anyhow::anyhow!("distributed-lock-postgres: {e}"))?,
            _ => bail!("a hold given back to another library"),
        }
        Ok(())
    }
}

/// The plain counter S2's critical section reads and writes, on a
/// connection of its own: a Redis key on a blocking connection, or a
/// PostgreSQL row.
pub(crate) enum Counter {
    Redis(redis::Connection),
    Postgres(sqlx::PgConnection),
}

/// Redis key, and PostgreSQL table, of S2's counter.
pub(crate) const COUNTER: &str = "peers:s2:counter";

impl Counter {
    pub(crate) async fn connect(engine: Engine, url: &str) -> Result<Counter> {
        use sqlx::Connection;
        Ok(match engine {
            Engine::Redis => Counter::Redis(redis::Client::open(url)?.get_connection()?),
            Engine::Postgres => Counter::Postgres(
                sqlx::PgConnection::connect(url)
                    .await
                    .context("the counter's connection")?,
            ),
        })
    }

    /// Sets the counter to 0 (making its table first).
    pub(crate) async fn reset(&mut self) -> Result<()> {
        match self {
            Counter::Redis(c) => redis::cmd("SET").arg(COUNTER).arg(0).query::<()>(c)?,
            Counter::Postgres(c) => {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS peers_counter (k int PRIMARY KEY, v bigint)",
                )
                .execute(&mut *c)
                .await?;
                sqlx::query(
                    "INSERT INTO peers_counter VALUES (1, 0) ON CONFLICT (k) DO UPDATE SET v = 0",
                )
                .execute(&mut *c)
                .await?;
            }
        }
        Ok(())
    }

    pub(crate) async fn get(&mut self) -> Result<i64> {
        Ok(match self {
            Counter::Redis(c) => redis::cmd("GET")
                .arg(COUNTER)
                .query::<Option<i64>>(c)?
                .unwrap_or(0),
            Counter::Postgres(c) => {
                sqlx::query_scalar("SELECT v FROM peers_counter WHERE k = 1")
                    .fetch_one(&mut *c)
                    .await?
            }
        })
    }

    pub(crate) async fn set(&mut self, v: i64) -> Result<()> {
        match self {
            Counter::Redis(c) => redis::cmd("SET").arg(COUNTER).arg(v).query::<()>(c)?,
            Counter::Postgres(c) => {
                sqlx::query("UPDATE peers_counter SET v = $1 WHERE k = 1")
                    .bind(v)
                    .execute(&mut *c)
                    .await?;
            }
        }
        Ok(())
    }
}
