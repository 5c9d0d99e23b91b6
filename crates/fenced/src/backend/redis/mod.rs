//! Redis: `redis://`, `rediss://`, `redis+sentinel://`, `redis+cluster://`
//! and `redlock://`.
//!
//! Every state change is one Lua script (see [`scripts`] for the keys), so
//! one round trip to acquire and one to release. Waiters sleep on the
//! lock's pub/sub channel, one subscription connection per client, with a
//! fallback re-check when the first lease in their way runs out (a foreign
//! client's release publishes nothing, and an expiry never does).
//!
//! Two layouts, chosen by `?layout=`:
//! - `redisson` (default): the lock is a hash in Redisson `RLock`'s layout,
//!   and releases publish Redisson's unlock message on its channel, so
//!   fenced and Redisson services exclude each other on the same name.
//!   While fenced waiters queue (fair or not), a release publishes the head's
//!   ticket instead, on the channel of the head's client
//!   `<channel>:<client id>` (as Redisson's `RFairLock` publishes on a
//!   channel per waiter), waking only that waiter; a Redisson
//!   waiter then looks again when the lease it waited on would have ended.
//! - `simple`: the lock is a string in redis-py `Lock`'s layout (`SET name
//!   token NX PX`), so fenced and Python services exclude each other.
//!   Mutexes only (fair or not).
//!
//! Guarantee: exact while the master lives. A master that dies before a
//! grant reaches its replicas can let two holders in after a failover
//! (`min_replicas` narrows that window); fencing tokens never go below the
//! server's clock in microseconds, so they keep rising across a restart
//! without persistence.

mod conn;
pub(crate) use conn::ROUND_TRIPS;
pub(crate) mod redlock;
mod scripts;
mod sentinel;
mod subscribe;

use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::endpoints::Endpoints;
use crate::spi::grant::permits_differ;
use crate::spi::lease::QUEUE_TTL;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, HoldRef, HolderInfo, LockBackend, LockStatus, Mode, Outcome,
    RegisterValue, RegisterWrite, Renewal, Reply, Store, Ticket, Withdrawal, WriteRule,
};
use conn::{Conn, Lane, Node, Target};
use redis::Value;
use scripts::Scripts;
use std::sync::Arc;
use std::time::Duration;
use subscribe::Subscriber;

mod attempt;
mod doctor;
mod holds;
mod scan;
mod store;

const DEFAULT_PORT: u16 = 6379;
const SENTINEL_PORT: u16 = 26379;
/// Lua counts in doubles, exact for integers up to 2^53.
const EXACT_IN_LUA: u64 = 1 << 53;
/// Holds renewed by one script call on a single server.
const RENEW_BATCH: usize = 200;

const PARAMS: &[&str] = &[
    "layout",
    "nat",
    "min_replicas",
    "wait_timeout",
    "timeout",
    "sentinel_user",
    "sentinel_password",
    "ca",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Redisson,
    Simple,
}

/// The keys and channel of one lock name, all in the name's cluster slot.
struct Keys {
    lock: String,
    counter: String,
    holds: String,
    queue: String,
    qexp: String,
    register: String,
    /// Where a register's writes are announced to its watchers.
    register_channel: String,
    /// A rate limiter's state (see `spi::rate`).
    rate: String,
    channel: String,
    /// The last released hold id (Cluster only).
    released: String,
}

impl Keys {
    fn of(name: &LockName) -> Result<Keys> {
        let n = name.as_str();
        Ok(Keys {
            lock: n.to_owned(),
            counter: beside("redisson_lock_token", n)?,
            holds: beside("fenced_holds", n)?,
            queue: beside("fenced_queue", n)?,
            qexp: beside("fenced_qexp", n)?,
            register: beside("fenced_register", n)?,
            register_channel: beside("fenced_register_channel", n)?,
            rate: beside("fenced_rate", n)?,
            channel: beside("redisson_lock__channel", n)?,
            released: beside("fenced_released", n)?,
        })
    }

    /// The channel on which a release wakes `owner` when it heads the
    /// queue (Redisson `RFairLock`'s `<channel>:<field>`).
    fn wake_channel(&self, client: &str) -> String {
        format!("{}:{client}", self.channel)
    }

    fn lock_keys(&self) -> [&str; 5] {
        [
            &self.lock,
            &self.counter,
            &self.holds,
            &self.queue,
            &self.qexp,
        ]
    }
}

/// The key `prefix:{name}` (Redisson's naming), which Redis Cluster puts in
/// the same slot as `name`; `prefix:name` when the name carries its own
/// `{tag}`. A name with a `}` but no non-empty `{tag}` is refused: no key
/// beside it could share its slot.
fn beside(prefix: &str, name: &str) -> Result<String> {
    let tagged = name
        .find('{')
        .and_then(|i| name[i + 1..].find('}').map(|j| j > 0))
        .unwrap_or(false);
    if tagged {
        Ok(format!("{prefix}:{name}"))
    } else if name.contains('}') {
        Err(Error::invalid(format!(
            "lock name {name:?} has a '}}' without a non-empty '{{tag}}' before it: Redis \
             Cluster could not keep its keys in one slot. Drop the braces, or use one \
             '{{tag}}' (e.g. \"orders:{{42}}\")"
        )))
    } else {
        Ok(format!("{prefix}:{{{name}}}"))
    }
}

pub(crate) struct RedisBackend {
    scheme: &'static str,
    /// Who the deployment is (see `Backend::identity`).
    identity: String,
    /// How long one request may take (`timeout=`).
    timeout: Duration,
    node: Node,
    layout: Layout,
    scripts: Scripts,
    min_replicas: u32,
    wait_timeout: Duration,
    subscriber: Subscriber,
    /// Whether unfair waiters queue too, so that a release wakes one
    /// waiter; not on RedLock's masters, where tickets would differ per
    /// master.
    queue_waiters: bool,
}

impl RedisBackend {
    /// Opens `redis://`, `rediss://`, `redis+sentinel://` or `redis+cluster://`.
    pub(crate) async fn open(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
        let port = if url.starts_with("redis+sentinel:") {
            SENTINEL_PORT
        } else {
            DEFAULT_PORT
        };
        let mut ep = Endpoints::parse(url, port)?;
        let backend = RedisBackend::from_endpoints(&mut ep, wakeups)?;
        ep.finish(PARAMS)?;
        backend.check().await?;
        Ok(Arc::new(backend))
    }

    fn from_endpoints(ep: &mut Endpoints, wakeups: Arc<Wakeups>) -> Result<RedisBackend> {
        let layout = match ep.take("layout").as_deref() {
            None | Some("redisson") => Layout::Redisson,
            Some("simple") => Layout::Simple,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "layout={other:?} in {:?}: use `redisson` (Redisson RLock's hash, the \
                     default) or `simple` (redis-py Lock's string)",
                    ep.redacted()
                )));
            }
        };
        let min_replicas = ep.take_number("min_replicas")?.unwrap_or(0);
        let wait_timeout = ep
            .take_duration("wait_timeout")?
            .unwrap_or(Duration::from_secs(1));
        let timeout = ep.take_timeout()?;
        let ca = ep.take_ca(ep.scheme == "rediss", "rediss:")?;
        let redacted = ep.redacted().to_owned();
        let client_err = |e: redis::RedisError| {
            Error::invalid(format!("bad Redis URL {redacted:?}: {e}")).with_source(e)
        };
        let creds = ep
            .userinfo
            .as_ref()
            .map_or(String::new(), |u| format!("{u}@"));
        let nat = nat_map(ep)?;
        if !nat.is_empty() && !matches!(ep.scheme.as_str(), "redis+sentinel" | "redis+cluster") {
            return Err(Error::invalid(format!(
                "nat= in {redacted:?}: an address map applies to the addresses Sentinel \
                 and Cluster announce (redis+sentinel://, redis+cluster://)"
            )));
        }
        let (scheme, target) = match ep.scheme.as_str() {
            s @ ("redis" | "rediss") => {
                if ep.hosts.len() != 1 {
                    return Err(Error::invalid(format!(
                        "{redacted:?} names {} hosts: a {s}:// URL names one server; use \
                         redlock:// for independent masters or redis+cluster:// for a cluster",
                        ep.hosts.len()
                    )));
                }
                let u = format!("{s}://{creds}{}/{}", ep.addr(0), ep.path);
                let scheme = if s == "redis" { "redis" } else { "rediss" };
                // `ca=`: the server's certificate is checked against that
                // authority alone; without it, against the webpki roots.
                // redis builds its TLS configuration on the process's
                // default crypto provider, and panics without exactly one:
                // ring, unless the application installed one already.
                #[cfg(feature = "tls")]
                if s == "rediss" {
                    let _ = rustls::crypto::ring::default_provider().install_default();
                }
                #[cfg(feature = "tls")]
                let client = match ca {
                    Some(root_cert) => redis::Client::build_with_tls(
                        u,
                        redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(root_cert),
                        },
                    ),
                    None => redis::Client::open(u),
                };
                #[cfg(not(feature = "tls"))]
                let client = {
                    debug_assert!(ca.is_none(), "rediss:// is refused without TLS");
                    redis::Client::open(u)
                };
                (scheme, Target::Fixed(Box::new(client.map_err(client_err)?)))
            }
            "redis+sentinel" => {
                let mut parts = ep.path.splitn(2, '/');
                let service = parts.next().unwrap_or("").to_owned();
                if service.is_empty() {
                    return Err(Error::invalid(format!(
                        "{redacted:?} names no service: use redis+sentinel://h1:p1,h2:p2/SERVICE"
                    )));
                }
                let db: i64 = match parts.next().filter(|d| !d.is_empty()) {
                    None => 0,
                    Some(d) => d.parse().map_err(|_| {
                        Error::invalid(format!("database {d:?} in {redacted:?} is not a number"))
                    })?,
                };
                let s_user = ep.take("sentinel_user");
                let s_pass = ep.take("sentinel_password");
                let sentinels = (0..ep.hosts.len())
                    .map(|i| {
                        let mut info = redis::RedisConnectionInfo::default();
                        if let Some(u) = &s_user {
                            info = info.set_username(u);
                        }
                        if let Some(p) = &s_pass {
                            info = info.set_password(p);
                        }
                        let (h, p) = &ep.hosts[i];
                        let addr = redis::ConnectionAddr::Tcp(h.clone(), *p);
                        redis::Client::open(
                            redis::IntoConnectionInfo::into_connection_info(addr)?
                                .set_redis_settings(info),
                        )
                    })
                    .collect::<redis::RedisResult<Vec<_>>>()
                    .map_err(client_err)?;
                let mut node_info = redis::RedisConnectionInfo::default().set_db(db);
                if let Some(u) = &ep.user {
                    node_info = node_info.set_username(u);
                }
                if let Some(p) = &ep.password {
                    node_info = node_info.set_password(p);
                }
                let client = sentinel::Sentinels::new(sentinels, service, node_info, timeout, nat);
                ("redis+sentinel", Target::Sentinel(Box::new(client)))
            }
            "redis+cluster" => {
                let urls: Vec<String> = (0..ep.hosts.len())
                    .map(|i| format!("redis://{creds}{}", ep.addr(i)))
                    .collect();
                let seeds = urls
                    .iter()
                    .map(|u| redis::Client::open(u.as_str()))
                    .collect::<redis::RedisResult<Vec<_>>>()
                    .map_err(client_err)?;
                let map = nat
                    .into_iter()
                    .map(|((h, p), (th, tp))| {
                        (
                            redis::cluster::NodeAddress::new(h, p),
                            redis::cluster::NodeAddress::new(th, tp),
                        )
                    })
                    .collect();
                let client = redis::cluster::ClusterClient::builder(urls)
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .node_address_map(map)
                    .build()
                    .map_err(client_err)?;
                ("redis+cluster", Target::Cluster(Box::new(client), seeds))
            }
            other => {
                return Err(Error::invalid(format!(
                    "{other}:// is not a Redis URL scheme"
                )));
            }
        };
        let subscriber = Subscriber::new(wakeups);
        let identity = identity_of(scheme, ep);
        Ok(RedisBackend {
            scheme,
            identity,
            timeout,
            node: Node::new(target, redacted, timeout),
            layout,
            scripts: Scripts::new(layout == Layout::Simple),
            min_replicas,
            wait_timeout,
            subscriber,
            queue_waiters: true,
        })
    }
}

/// An address as `host:port`.
type Addr = (String, u16);

/// The `nat=ANNOUNCED=REACHABLE` parameters (Redisson's `natMapper`): the
/// address a Sentinel or Cluster node announces, and the one this client
/// reaches it at, for servers behind NAT, in containers, or behind a
/// proxy. Each side is `host:port`.
fn nat_map(ep: &mut Endpoints) -> Result<Vec<(Addr, Addr)>> {
    let redacted = ep.redacted().to_owned();
    let addr = |s: &str| -> Option<Addr> {
        let (h, p) = s.rsplit_once(':')?;
        let h = h.trim_start_matches('[').trim_end_matches(']');
        Some((h.to_owned(), p.parse().ok().filter(|p| *p > 0)?))
    };
    ep.take_all("nat")
        .into_iter()
        .map(|v| {
            v.split_once('=')
                .and_then(|(a, b)| Some((addr(a)?, addr(b)?)))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "nat={v:?} in {redacted:?}: write it as ANNOUNCED=REACHABLE, each \
                         host:port (e.g. nat=10.0.0.5:6379=127.0.0.1:7001)"
                    ))
                })
        })
        .collect()
}

/// The deployment's identity: the scheme (TLS or not, it is one server),
/// the hosts in a stable order with their ports, and the database or
/// Sentinel service; no credentials, no tuning.
fn identity_of(scheme: &str, ep: &Endpoints) -> String {
    let mut hosts: Vec<String> = (0..ep.hosts.len())
        .map(|i| ep.addr(i).to_ascii_lowercase())
        .collect();
    hosts.sort();
    hosts.dedup();
    let scheme = scheme.replace("rediss", "redis");
    let path = ep.path.trim_matches('/');
    let path = match scheme.as_str() {
        "redis" => {
            let db: i64 = path.parse().unwrap_or(0);
            db.to_string()
        }
        "redis+sentinel" => {
            let mut parts = path.splitn(2, '/');
            let service = parts.next().unwrap_or("");
            let db: i64 = parts.next().and_then(|d| d.parse().ok()).unwrap_or(0);
            format!("{service}/{db}")
        }
        _ => String::new(),
    };
    format!("{scheme}://{}/{path}", hosts.join(","))
}

/// Whole milliseconds, at least 1.
fn ms(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_lock_slot() {
        assert_eq!(beside("p", "a").unwrap(), "p:{a}");
        assert_eq!(beside("p", "x{tag}y").unwrap(), "p:x{tag}y");
        assert_eq!(beside("p", "a{b").unwrap(), "p:{a{b}");
        assert!(beside("p", "a}b").is_err());
        assert!(beside("p", "a{}b").is_err());
    }
}
