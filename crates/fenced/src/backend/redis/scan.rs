//! The names of the locks a deployment keeps, for `fenced list`.
//!
//! A lock's own key is its bare name (Redisson's hash, redis-py's string),
//! which nothing tells apart from the application's keys: the names are
//! read back from the keys fenced keeps beside it instead, the fencing
//! counter (`redisson_lock_token:{N}`, made at a grant) and the wait queue
//! (`fenced_queue:{N}`). A lock that only Redisson or redis-py ever took
//! has neither, and is not listed.

use super::conn::Conn;
use super::*;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

/// The key prefixes whose keys name a lock.
const NAMING: [&str; 2] = ["redisson_lock_token:", "fenced_queue:"];

/// Keys per `SCAN` step.
const STEP: usize = 1000;

impl RedisBackend {
    pub(super) async fn names_inner(&self, prefix: &str) -> Result<Vec<LockName>> {
        let keys = self
            .node
            .run(|c| async move {
                let mut keys = Vec::new();
                for naming in NAMING {
                    keys.extend(scan(c.clone(), &format!("{naming}*")).await?);
                }
                Ok(keys)
            })
            .await?;
        let mut names = std::collections::BTreeSet::new();
        for key in &keys {
            let Some(rest) = NAMING.iter().find_map(|n| key.strip_prefix(n)) else {
                continue;
            };
            names.extend(
                candidates(rest)
                    .into_iter()
                    .filter(|n| n.starts_with(prefix))
                    .filter_map(|n| LockName::new(&n).ok()),
            );
        }
        Ok(names.into_iter().collect())
    }
}

/// The lock names whose keys end in `rest` (see `beside`): `{X}` is the
/// key of name `X` and of name `{X}` alike, so both are candidates (the
/// status of each tells which is held); any other `rest` is the name.
fn candidates(rest: &str) -> Vec<String> {
    match rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        Some(x) if !x.is_empty() && !x.contains(['{', '}']) => vec![x.to_owned(), rest.to_owned()],
        _ => vec![rest.to_owned()],
    }
}

/// Every key matching `pattern`: on a server or Sentinel's master one
/// `SCAN` walk; on a Cluster one on each master.
async fn scan(conn: Conn, pattern: &str) -> redis::RedisResult<Vec<String>> {
    let mut keys = Vec::new();
    match conn {
        Conn::Plain(mut c) => {
            let mut cursor = 0;
            loop {
                let (next, batch): (u64, Vec<String>) =
                    step(cursor, pattern).query_async(&mut c).await?;
                keys.extend(batch);
                if next == 0 {
                    return Ok(keys);
                }
                cursor = next;
            }
        }
        Conn::Cluster(mut c) => {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut c)
                .await?;
            for (host, port) in masters(&nodes) {
                let mut cursor = 0;
                loop {
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    });
                    let (next, batch): (u64, Vec<String>) = redis::from_redis_value(
                        c.route_command(step(cursor, pattern), route).await?,
                    )?;
                    keys.extend(batch);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            Ok(keys)
        }
    }
}

/// One `SCAN` step from `cursor`.
fn step(cursor: u64, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(STEP);
    cmd
}

/// The live masters in `CLUSTER NODES`' answer, as host and port.
fn masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            let addr = fields.get(1)?.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_locks() {
        assert_eq!(candidates("{orders:1}"), ["orders:1", "{orders:1}"]);
        assert_eq!(candidates("orders:{42}"), ["orders:{42}"]);
        assert_eq!(candidates("{}"), ["{}"]);
        let nodes = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b2 127.0.0.1:7001@17001 slave a1 0 0 1 connected\n\
                     c3 127.0.0.1:7002@17002 master,fail - 0 0 3 connected\n\
                     d4 127.0.0.1:7003@17003 master - 0 0 2 connected 5461-16383";
        assert_eq!(
            masters(nodes),
            [
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7003)
            ]
        );
    }
}
