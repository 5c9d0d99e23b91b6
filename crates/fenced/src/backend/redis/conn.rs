//! Connections to one Redis deployment (a server, a Sentinel-watched
//! master, or a Cluster), re-established after a drop or a failover.

use crate::error::{Error, Result};
use crate::spi::sync::unpoisoned;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, Value};
use std::sync::Mutex;
use std::time::Duration;

/// Where the master is found.
pub(super) enum Target {
    Fixed(Box<redis::Client>),
    Sentinel(Box<super::sentinel::Sentinels>),
    /// The cluster client, and one plain client per seed node for pub/sub.
    Cluster(Box<redis::cluster::ClusterClient>, Vec<redis::Client>),
}

/// A live connection of any topology.
#[derive(Clone)]
pub(super) enum Conn {
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// Requests this process has sent on Redis command connections; a
/// pipeline (or a script) is one. Read by [`crate::metrics`].
pub(crate) static ROUND_TRIPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn count() {
    ROUND_TRIPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

impl Conn {
    /// `WAIT want timeout_ms` for the writes this connection sent: on a
    /// Cluster, to the master of `key`'s slot alone (the cluster client
    /// would send it to every master and answer with the fewest replicas
    /// any shard has, so one unrelated shard would fail every grant).
    pub(super) async fn wait_replicas(
        &mut self,
        key: &str,
        want: u32,
        timeout_ms: u64,
    ) -> redis::RedisResult<i64> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(want).arg(timeout_ms);
        match self {
            Conn::Plain(c) => wait.query_async(c).await,
            Conn::Cluster(c) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                count();
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::with_key(key, SlotAddr::Master),
                ));
                Ok(redis::from_redis_value(
                    c.route_command(wait, route).await?,
                )?)
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        count();
        match self {
            Conn::Plain(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self::count();
        match self {
            Conn::Plain(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Plain(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Which of a deployment's connections a command goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lane {
    /// Everything but what follows.
    Main,
    /// Grants that `WAIT` for replicas: `WAIT` blocks the connection it is
    /// sent on until the replicas answer, and counts the writes sent on
    /// that connection, so a grant and its `WAIT` go together on a
    /// connection of their own, and renewals on the main one never queue
    /// behind a `WAIT`.
    Wait,
}

/// A cached connection: the connection, its generation, and (under
/// Sentinel) the number of master switches announced before it was made.
type Cached = Mutex<Option<(u64, Conn, u64)>>;

/// One deployment: a cached connection per [`Lane`], replaced when it fails.
pub(super) struct Node {
    pub(super) target: Target,
    pub(super) label: String,
    config: AsyncConnectionConfig,
    cached: [Cached; 2],
    connecting: [tokio::sync::Mutex<u64>; 2],
}

impl Node {
    pub(super) fn new(target: Target, label: String, timeout: Duration) -> Node {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Node {
            target,
            label,
            config,
            cached: [Mutex::new(None), Mutex::new(None)],
            connecting: [tokio::sync::Mutex::new(0), tokio::sync::Mutex::new(0)],
        }
    }

    /// Master switches the sentinels have announced (Sentinel only).
    pub(super) fn switches(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match &self.target {
            Target::Sentinel(s) => Some(s.switches()),
            _ => None,
        }
    }

    fn switches_seen(&self) -> u64 {
        match &self.target {
            Target::Sentinel(s) => s.switches_seen(),
            _ => 0,
        }
    }

    /// The cached connection of `lane`, unless a master switch was
    /// announced since it was made.
    fn current(&self, lane: Lane) -> Option<(u64, Conn)> {
        let cached = unpoisoned(&self.cached[lane as usize]);
        match &*cached {
            Some((generation, conn, seen)) if *seen == self.switches_seen() => {
                Some((*generation, conn.clone()))
            }
            _ => None,
        }
    }

    /// The current connection of `lane`, made if there is none.
    async fn conn(&self, lane: Lane) -> Result<(u64, Conn)> {
        if let Some(c) = self.current(lane) {
            return Ok(c);
        }
        let mut generation = self.connecting[lane as usize].lock().await;
        if let Some(c) = self.current(lane) {
            return Ok(c);
        }
        // Read before the lookup: a switch announced during it connects again.
        let seen = self.switches_seen();
        let conn = self.connect().await.map_err(|e| self.error(e))?;
        *generation += 1;
        *unpoisoned(&self.cached[lane as usize]) = Some((*generation, conn.clone(), seen));
        Ok((*generation, conn))
    }

    async fn connect(&self) -> redis::RedisResult<Conn> {
        match &self.target {
            Target::Fixed(client) => Ok(Conn::Plain(
                client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?,
            )),
            Target::Sentinel(s) => {
                let client = s.master().await?;
                let mut c = client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?;
                // Sentinel may still name a master that was just demoted.
                let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut c).await?;
                if !matches!(role.first(), Some(Value::BulkString(r)) if r == b"master") {
                    return Err(RedisError::from((
                        redis::ErrorKind::Io,
                        "sentinel named a server that is not a master (yet)",
                    )));
                }
                Ok(Conn::Plain(c))
            }
            Target::Cluster(client, _) => Ok(Conn::Cluster(client.get_async_connection().await?)),
        }
    }

    /// A new pub/sub connection to this deployment.
    pub(super) async fn pubsub(&self) -> redis::RedisResult<redis::aio::PubSub> {
        match &self.target {
            Target::Fixed(c) => c.get_async_pubsub().await,
            Target::Sentinel(s) => s.master().await?.get_async_pubsub().await,
            // PUBLISH reaches every node of a cluster: any one will do.
            Target::Cluster(_, seeds) => {
                let mut last = None;
                for c in seeds {
                    match c.get_async_pubsub().await {
                        Ok(p) => return Ok(p),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    RedisError::from((redis::ErrorKind::InvalidClientConfig, "no cluster nodes"))
                }))
            }
        }
    }

    /// Runs `f` on the connection; a connection-level failure drops the
    /// cached connection so the next call connects again (following a
    /// failover), and is reported as `Unavailable`, which callers retry.
    pub(super) async fn run<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        self.run_on(Lane::Main, f).await
    }

    /// [`run`](Self::run) on the connection of `lane`.
    pub(super) async fn run_on<T, F, Fut>(&self, lane: Lane, f: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let (generation, conn) = self.conn(lane).await?;
        match f(conn).await {
            Ok(v) => Ok(v),
            Err(e) => {
                if reconnect_after(&e) {
                    let mut cached = unpoisoned(&self.cached[lane as usize]);
                    if cached.as_ref().is_some_and(|(g, ..)| *g == generation) {
                        *cached = None;
                    }
                }
                Err(self.error(e))
            }
        }
    }

    /// Maps a Redis error to fenced's kinds, naming this deployment.
    pub(super) fn error(&self, e: RedisError) -> Error {
        map_error(&self.label, e)
    }
}

/// Errors after which the connection (or the master it points at) is suspect.
fn reconnect_after(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

pub(super) fn map_error(label: &str, e: RedisError) -> Error {
    let code = e.code().map(str::to_owned);
    if e.kind() == redis::ErrorKind::InvalidClientConfig {
        return Error::invalid(format!("Redis at {label}: {e}")).with_source(e);
    }
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return Error::invalid(format!("Redis at {label} refused the credentials: {e}"))
            .with_source(e);
    }
    match code.as_deref() {
        Some("WRONGPASS" | "NOAUTH" | "NOPERM") => {
            Error::invalid(format!("Redis at {label} refused us: {e}")).with_source(e)
        }
        Some("WRONGTYPE") => Error::protocol(format!(
            "a key of this lock at {label} holds another type of value: another program \
             uses this name ({e})"
        ))
        .with_source(e),
        Some("READONLY" | "MASTERDOWN" | "LOADING" | "TRYAGAIN" | "CLUSTERDOWN" | "BUSY") => {
            Error::unavailable(format!("Redis at {label} cannot take writes now: {e}"))
                .with_source(e)
        }
        _ if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.is_cluster_error() =>
        {
            Error::unavailable(format!("Redis at {label} is unreachable: {e}")).with_source(e)
        }
        _ if e.to_string().contains("WRONGPASS") || e.to_string().contains("NOAUTH") => {
            Error::invalid(format!("Redis at {label} refused us: {e}")).with_source(e)
        }
        _ => {
            Error::protocol(format!("Redis at {label} answered with an error: {e}")).with_source(e)
        }
    }
}
