//! The engine's own write loop, the limit a lock's S1 is measured against:
//! one-row upserts on one SQL connection, put-with-lease + delete on one
//! etcd connection, create-ephemeral-sequential + delete on one ZooKeeper
//! session, `SET` over the `redis` crate's multiplexed connection (the
//! client fenced itself uses).
//!
//! The loop runs in slices, and S1 runs between them, so that the limit
//! and the lock see the same host: on a shared machine the speed of both
//! drifts by tens of percent within a minute, and measured one after the
//! other their ratio drifts with it.

// With no engine built in, the loops below have no arms to run.
#![cfg_attr(
    not(any(
        feature = "postgres",
        feature = "mysql",
        feature = "etcd",
        feature = "zookeeper",
        feature = "redis"
    )),
    allow(unused_variables, unreachable_code, clippy::never_loop)
)]

use std::time::Instant;

/// One open connection and what its loop has measured so far.
pub(super) struct RawLoop {
    conn: Conn,
    /// Iterations for a limit measured in one go.
    pub(super) default_n: u64,
    /// Iterations of the loop per acquire + release (two statements or
    /// `SET`s; one create/put + delete pair).
    per_pair: f64,
    what: &'static str,
    n: u64,
    secs: f64,
}

enum Conn {
    #[cfg(feature = "postgres")]
    Pg(sqlx::PgConnection),
    #[cfg(feature = "mysql")]
    My(sqlx::MySqlConnection),
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd_client::Client>, i64),
    #[cfg(feature = "zookeeper")]
    Zk(zookeeper_client::Client),
    #[cfg(feature = "redis")]
    Redis(redis::aio::MultiplexedConnection),
    /// Keeps the matches whole when no engine above is built in.
    #[allow(dead_code)]
    None(std::convert::Infallible),
}

#[cfg(feature = "postgres")]
const PG_UPSERT: &str = "INSERT INTO fenced_locks (name) VALUES ('bench:limit') \
    ON CONFLICT (name) DO UPDATE SET token = fenced_locks.token + 1";
#[cfg(feature = "mysql")]
const MY_UPSERT: &str = "INSERT INTO fenced_locks (name) VALUES ('bench:limit') \
    ON DUPLICATE KEY UPDATE token = token + 1";
#[cfg(feature = "etcd")]
const ETCD_KEY: &str = "bench:limit/raw";

impl RawLoop {
    /// A connection for the loop of `url`'s engine, or `None` where there
    /// is no single server to loop on (Sentinel, Cluster, RedLock, SQLite).
    pub(super) async fn open(url: &str) -> anyhow::Result<Option<RawLoop>> {
        let scheme = url.split("://").next().unwrap_or("");
        let (conn, default_n, per_pair, what) = match scheme {
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => {
                use sqlx::Connection;
                let c = sqlx::PgConnection::connect(&without_query(url)?).await?;
                (Conn::Pg(c), 5000, 2.0, PG_UPSERT)
            }
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => {
                use sqlx::Connection;
                let u = without_query(url)?.replacen("mariadb://", "mysql://", 1);
                let c = sqlx::MySqlConnection::connect(&u).await?;
                (Conn::My(c), 5000, 2.0, MY_UPSERT)
            }
            #[cfg(feature = "etcd")]
            "etcd" => {
                let rest = &url["etcd://".len()..];
                let hosts = rest.split(['?', '/']).next().unwrap_or("");
                let endpoints: Vec<String> =
                    hosts.split(',').map(|h| format!("http://{h}")).collect();
                let mut c = etcd_client::Client::connect(&endpoints, None).await?;
                // Outlives any bench run: S1 may come after S5's long hold.
                let lease = c.lease_grant(3600, None).await?.id();
                let what = "put bench:limit/raw with a lease; delete bench:limit/raw";
                (Conn::Etcd(Box::new(c), lease), 2000, 1.0, what)
            }
            #[cfg(feature = "zookeeper")]
            "zk" => {
                let connect = url["zk://".len()..].split('?').next().unwrap_or("");
                let z = zookeeper_client::Client::connect(connect).await?;
                (
                    Conn::Zk(z),
                    2000,
                    1.0,
                    "create -e -s /bench-limit-; delete it",
                )
            }
            #[cfg(feature = "redis")]
            "redis" => {
                let client = redis::Client::open(without_query(url)?)?;
                let c = client.get_multiplexed_async_connection().await?;
                let what = "SET over the redis crate's multiplexed connection (fenced's client)";
                (Conn::Redis(c), 20_000, 2.0, what)
            }
            _ => return Ok(None),
        };
        Ok(Some(RawLoop {
            conn,
            default_n,
            per_pair,
            what,
            n: 0,
            secs: 0.0,
        }))
    }

    /// Runs `n` more iterations, timed.
    pub(super) async fn run(&mut self, n: u64) -> anyhow::Result<()> {
        let started = Instant::now();
        for _ in 0..n {
            match &mut self.conn {
                #[cfg(feature = "postgres")]
                Conn::Pg(c) => {
                    sqlx::query(PG_UPSERT).execute(&mut *c).await?;
                }
                #[cfg(feature = "mysql")]
                Conn::My(c) => {
                    sqlx::query(MY_UPSERT).execute(&mut *c).await?;
                }
                #[cfg(feature = "etcd")]
                Conn::Etcd(c, lease) => {
                    let opts = etcd_client::PutOptions::new().with_lease(*lease);
                    c.put(ETCD_KEY, "", Some(opts)).await?;
                    c.delete(ETCD_KEY, None).await?;
                }
                #[cfg(feature = "zookeeper")]
                Conn::Zk(z) => {
                    let opts = zookeeper_client::CreateMode::EphemeralSequential
                        .with_acls(zookeeper_client::Acls::anyone_all());
                    let (_, seq) = z.create("/bench-limit-", b"", &opts).await?;
                    z.delete(&format!("/bench-limit-{seq}"), None).await?;
                }
                #[cfg(feature = "redis")]
                Conn::Redis(c) => {
                    let () = redis::cmd("SET")
                        .arg("bench:limit")
                        .arg("v")
                        .query_async(c)
                        .await?;
                }
                Conn::None(never) => match *never {},
            }
        }
        self.n += n;
        self.secs += started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Loop iterations per second so far.
    pub(super) fn rate(&self) -> f64 {
        self.n as f64 / self.secs
    }

    /// Acquire + release pairs per second the loop's rate amounts to.
    pub(super) fn pairs_rate(&self) -> f64 {
        self.rate() / self.per_pair
    }

    /// Whether this is the Redis client's `SET` loop (reported beside
    /// `redis-benchmark`'s, which is the Redis limit).
    pub(super) fn is_redis(&self) -> bool {
        #[cfg(feature = "redis")]
        if let Conn::Redis(_) = self.conn {
            return true;
        }
        false
    }

    /// What ran, for the limit row.
    pub(super) fn command(&self) -> String {
        format!("{} x ({})", self.n, self.what)
    }

    pub(super) async fn close(self) {
        match self.conn {
            #[cfg(feature = "postgres")]
            Conn::Pg(c) => {
                use sqlx::Connection;
                let _ = c.close().await;
            }
            #[cfg(feature = "mysql")]
            Conn::My(c) => {
                use sqlx::Connection;
                let _ = c.close().await;
            }
            #[cfg(feature = "etcd")]
            Conn::Etcd(mut c, lease) => {
                let _ = c.lease_revoke(lease).await;
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
}

#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "redis")),
    allow(dead_code)
)]
fn without_query(url: &str) -> anyhow::Result<String> {
    let mut u = url::Url::parse(url)?;
    u.set_query(None);
    Ok(u.to_string())
}
