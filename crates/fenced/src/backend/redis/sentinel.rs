//! Finding the master a group of Redis Sentinels watches, and following it
//! when it moves.
//!
//! Written here rather than taken from the `redis` crate's Sentinel client,
//! which trusts the first sentinel that answers and keeps a connection for
//! as long as it works. After a failover both go wrong (`fenced torture
//! --spawn sentinel` shows it): a sentinel that has not heard of the newest
//! failover still names the old master; and a replaced master that nobody
//! has demoted yet (the sentinels could not reach it, or it restarted empty)
//! still answers `ROLE` as a master. A client left there goes on renewing a
//! hold the sentinels' master does not have, while that master grants the
//! lock to others, and never learns that its hold is lost.
//!
//! So: the master is the one named under the highest configuration epoch by
//! the sentinels that answer, and every `+switch-master` any sentinel
//! publishes for the service bumps a counter that makes the next command
//! connect again. There a hold that did not survive the failover is found
//! missing and reported lost.

use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, RedisResult};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How long a sentinel that dropped our subscription is left before we
/// subscribe again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// The sentinels of one service.
pub(crate) struct Sentinels {
    sentinels: Vec<Client>,
    service: String,
    /// Database and credentials for the master itself.
    node: redis::RedisConnectionInfo,
    config: AsyncConnectionConfig,
    /// Bumped on every `+switch-master` for `service`.
    switches: Arc<watch::Sender<u64>>,
    /// The subscriptions to `+switch-master`, one per sentinel, made on the
    /// first lookup (they need the runtime) and ended on drop.
    followers: Mutex<Option<Vec<tokio::task::AbortHandle>>>,
    /// Where to reach a master the sentinels announce at another address
    /// (the URL's `nat=`).
    nat: Vec<(super::Addr, super::Addr)>,
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for f in crate::spi::sync::unpoisoned(&self.followers)
            .take()
            .into_iter()
            .flatten()
        {
            f.abort();
        }
    }
}

impl Sentinels {
    pub(crate) fn new(
        sentinels: Vec<Client>,
        service: String,
        node: redis::RedisConnectionInfo,
        timeout: Duration,
        nat: Vec<(super::Addr, super::Addr)>,
    ) -> Sentinels {
        Sentinels {
            sentinels,
            service,
            node,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout)),
            switches: Arc::new(watch::channel(0).0),
            followers: Mutex::new(None),
            nat,
        }
    }

    /// Master switches as the sentinels announce them.
    pub(crate) fn switches(&self) -> watch::Receiver<u64> {
        self.switches.subscribe()
    }

    /// How many master switches the sentinels have announced so far.
    pub(crate) fn switches_seen(&self) -> u64 {
        *self.switches.borrow()
    }

    /// A client for the current master: the address named under the
    /// highest configuration epoch by the sentinels that answer. Waits for
    /// every sentinel to answer or fail: right after a failover only its
    /// leader may know the new epoch, and a majority without it would name
    /// the old master.
    pub(crate) async fn master(&self) -> RedisResult<Client> {
        self.follow();
        let asks = self.sentinels.iter().map(|s| self.ask(s));
        let mut named = Vec::new();
        let mut last_err = None;
        let mut unknown = 0;
        for answer in futures_util::future::join_all(asks).await {
            match answer {
                Ok(m) => named.push(m),
                Err(e) => {
                    if e.code() == Some("ERR") && e.to_string().contains("No such master") {
                        unknown += 1;
                    }
                    last_err = Some(e);
                }
            }
        }
        // The newest epoch; among answers of one epoch (which should agree),
        // the address most of them give.
        let count = |m: &Named| {
            named
                .iter()
                .filter(|o| o.epoch == m.epoch && o.ip == m.ip && o.port == m.port)
                .count()
        };
        let best = named
            .iter()
            .max_by_key(|m| (m.epoch, count(m)))
            .map(|m| (m.ip.clone(), m.port));
        let Some((ip, port)) = best else {
            if unknown == self.sentinels.len() {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "no sentinel watches a master of this name",
                    self.service.clone(),
                )));
            }
            return Err(last_err.unwrap_or_else(|| {
                RedisError::from((ErrorKind::InvalidClientConfig, "no sentinels given"))
            }));
        };
        let (ip, port) = self
            .nat
            .iter()
            .find(|(from, _)| from.0 == ip && from.1 == port)
            .map_or((ip, port), |(_, to)| to.clone());
        let addr = redis::ConnectionAddr::Tcp(ip, port);
        Client::open(
            redis::IntoConnectionInfo::into_connection_info(addr)?
                .set_redis_settings(self.node.clone()),
        )
    }

    /// One sentinel's view of the master: its address as
    /// `get-master-addr-by-name` gives it (which, during a failover's last
    /// step, is already the promoted replica's, while `SENTINEL MASTER`
    /// still shows the old master under the new epoch), and the
    /// configuration epoch from `SENTINEL MASTER`, in one round trip.
    async fn ask(&self, sentinel: &Client) -> RedisResult<Named> {
        let mut c = sentinel
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        let (addr, fields): (Option<(String, u16)>, HashMap<String, String>) = redis::pipe()
            .cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.service)
            .cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.service)
            .query_async(&mut c)
            .await?;
        let (ip, port) = addr.ok_or_else(|| {
            RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "a sentinel gave no address for",
                self.service.clone(),
            ))
        })?;
        Ok(Named {
            ip,
            port,
            // Absent on very old sentinels: then every answer ties.
            epoch: fields
                .get("config-epoch")
                .and_then(|e| e.parse().ok())
                .unwrap_or(0),
        })
    }

    /// Subscribes to `+switch-master` on every sentinel, once.
    fn follow(&self) {
        let mut followers = crate::spi::sync::unpoisoned(&self.followers);
        if followers.is_some() {
            return;
        }
        let tasks = self
            .sentinels
            .iter()
            .map(|s| {
                tokio::spawn(follow(
                    s.clone(),
                    self.service.clone(),
                    self.switches.clone(),
                ))
                .abort_handle()
            })
            .collect();
        *followers = Some(tasks);
    }
}

/// A master as one sentinel names it.
struct Named {
    ip: String,
    port: u16,
    epoch: u64,
}

/// Bumps `switches` on each `+switch-master` this sentinel publishes for
/// `service`; subscribes again if the sentinel goes away.
async fn follow(sentinel: Client, service: String, switches: Arc<watch::Sender<u64>>) {
    let mut subscribed_before = false;
    loop {
        match sentinel.get_async_pubsub().await {
            Ok(mut pubsub) => match pubsub.subscribe("+switch-master").await {
                Ok(()) => {
                    if subscribed_before {
                        // A switch may have come while we were away.
                        switches.send_modify(|n| *n += 1);
                    }
                    subscribed_before = true;
                    let mut messages = pubsub.on_message();
                    while let Some(m) = futures_util::StreamExt::next(&mut messages).await {
                        // "<service> <old ip> <old port> <new ip> <new port>"
                        let text: String = m.get_payload().unwrap_or_default();
                        if text.split(' ').next() == Some(service.as_str()) {
                            tracing::info!(switch = %text, "a sentinel announced a new master");
                            switches.send_modify(|n| *n += 1);
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot subscribe to +switch-master"),
            },
            Err(e) => tracing::debug!(error = %e, "a sentinel is unreachable"),
        }
        tokio::time::sleep(RESUBSCRIBE_AFTER).await;
    }
}
