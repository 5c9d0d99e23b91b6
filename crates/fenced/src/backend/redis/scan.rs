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
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};

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
                    .filter_map(|n| LockName::new(&n).ok())
                    // Only names that have keys: a key `{}` names none.
                    .filter(|n| Keys::of(n).is_ok()),
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
            // One slot of each master, from `CLUSTER SLOTS`: the SCAN goes
            // to the master of that slot by the cluster client's own slot
            // map, whatever address (a hostname, none) the node announces.
            let slots: redis::Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut c)
                .await?;
            for slot in one_slot_per_master(&slots)? {
                let mut cursor = 0;
                loop {
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::with_slot(slot, SlotAddr::Master),
                    ));
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

/// The first slot of one range of each master in `CLUSTER SLOTS`'
/// answer; masters told apart by their node ids.
fn one_slot_per_master(slots: &redis::Value) -> redis::RedisResult<Vec<Slot>> {
    use redis::Value as V;
    let bad = || {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "CLUSTER SLOTS answered in an unknown shape",
        ))
    };
    let V::Array(ranges) = slots else {
        return Err(bad());
    };
    let (mut seen, mut out) = (Vec::new(), Vec::new());
    for range in ranges {
        let V::Array(range) = range else {
            return Err(bad());
        };
        let (Some(V::Int(start)), Some(V::Array(master))) = (range.first(), range.get(2)) else {
            return Err(bad());
        };
        // Host, port, node id (the id since Redis 4).
        let id = master.get(2).or(master.get(1)).cloned();
        if seen.contains(&id) {
            continue;
        }
        seen.push(id);
        out.push(
            u16::try_from(*start)
                .ok()
                .and_then(Slot::new)
                .ok_or_else(bad)?,
        );
    }
    Ok(out)
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
        let node = |host: V, port: i64, id: &str| {
            V::Array(vec![
                host,
                V::Int(port),
                V::BulkString(id.as_bytes().to_vec()),
            ])
        };
        let range = |a: i64, b: i64, master: V| V::Array(vec![V::Int(a), V::Int(b), master]);
        let ip = || V::BulkString(b"10.0.0.1".to_vec());
        let slots = V::Array(vec![
            range(0, 100, node(ip(), 7000, "m1")),
            range(101, 200, node(V::Nil, 7002, "m2")),
            range(201, 300, node(ip(), 7000, "m1")),
        ]);
        let got = one_slot_per_master(&slots).unwrap();
        let want = [0, 101].map(|n| Slot::new(n).unwrap());
        assert_eq!(got, want, "a master with no address still counts");
        assert!(one_slot_per_master(&V::Int(1)).is_err());
    }
}
