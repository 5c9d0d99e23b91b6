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
/// key of name `X` (one with no `{tag}` of its own, braces and all) and
/// of name `{X}` alike, so both are candidates (the status of each tells
/// which is held); any other `rest` is the name.
fn candidates(rest: &str) -> Vec<String> {
    match rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        Some(x) if !x.is_empty() => vec![x.to_owned(), rest.to_owned()],
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
            // The masters as `CLUSTER SLOTS` names them: the addresses the
            // cluster client keeps its connections by.
            let slots: redis::Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut c)
                .await?;
            for (host, port) in masters(&slots) {
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

/// The master of each slot range in `CLUSTER SLOTS`' answer (its first
/// node), as host and port, each once.
fn masters(slots: &redis::Value) -> Vec<(String, u16)> {
    use redis::Value as V;
    let text = |v: &V| match v {
        V::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        V::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut out: Vec<(String, u16)> = Vec::new();
    let V::Array(ranges) = slots else {
        return out;
    };
    for range in ranges {
        let V::Array(range) = range else { continue };
        let Some(V::Array(master)) = range.get(2) else {
            continue;
        };
        let (Some(host), Some(V::Int(port))) = (master.first().and_then(text), master.get(1))
        else {
            continue;
        };
        let master = (host, *port as u16);
        if !out.contains(&master) {
            out.push(master);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_locks() {
        assert_eq!(candidates("{orders:1}"), ["orders:1", "{orders:1}"]);
        assert_eq!(candidates("orders:{42}"), ["orders:{42}"]);
        assert_eq!(candidates("{}"), ["{}"]);
        assert_eq!(candidates("{a{b}"), ["a{b", "{a{b}"]);
        use redis::Value as V;
        let node = |port: i64| {
            V::Array(vec![
                V::BulkString(b"10.0.0.1".to_vec()),
                V::Int(port),
                V::BulkString(b"id".to_vec()),
            ])
        };
        let range = |a: i64, b: i64, master: i64, replica: i64| {
            V::Array(vec![V::Int(a), V::Int(b), node(master), node(replica)])
        };
        let slots = V::Array(vec![
            range(0, 100, 7000, 7001),
            range(101, 200, 7002, 7003),
            range(201, 300, 7000, 7001),
        ]);
        assert_eq!(
            masters(&slots),
            [("10.0.0.1".to_owned(), 7000), ("10.0.0.1".to_owned(), 7002)]
        );
    }
}
