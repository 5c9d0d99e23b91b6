//! `fenced doctor` on Redis: persistence, eviction, replication, clock.

use super::*;
use crate::doctor::{Check, Verdict, clock_offset};

impl RedisBackend {
    /// One `CONFIG GET` value, or why it could not be read (managed Redis
    /// often renames or disables CONFIG).
    async fn config(&self, key: &'static str) -> std::result::Result<String, String> {
        self.node
            .run(move |mut c| async move {
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg(key)
                    .query_async::<Vec<String>>(&mut c)
                    .await
            })
            .await
            .map_err(|e| format!("CONFIG GET {key}: {e}"))?
            .into_iter()
            .nth(1)
            .ok_or_else(|| format!("CONFIG GET {key}: no such setting"))
    }

    /// The checks of this server; what cannot be read is `Unknown`, with
    /// why, so one refused command does not hide the rest.
    pub(super) async fn checks(&self) -> Result<Vec<Check>> {
        let mut out = Vec::new();
        let (aof, save, fsync) = (
            self.config("appendonly").await,
            self.config("save").await,
            self.config("appendfsync").await.ok(),
        );
        let unread = aof.as_ref().err().or(save.as_ref().err()).cloned();
        let (aof, save) = (aof.ok(), save.ok());
        out.push(match (aof.as_deref(), save.as_deref()) {
            (Some("yes"), _) if fsync.as_deref() == Some("no") => Check::new(
                "persistence",
                Verdict::Warn,
                "append-only file on, but appendfsync no: the kernel decides when it reaches \
                 the disk, and a host crash loses the grants since; appendfsync everysec \
                 loses at most a second",
            ),
            (Some("yes"), _) => Check::new(
                "persistence",
                Verdict::Pass,
                format!(
                    "append-only file on (appendfsync {}): a restart keeps the locks",
                    fsync.as_deref().unwrap_or("?")
                ),
            ),
            (Some(_), Some(s)) if !s.trim().is_empty() => Check::new(
                "persistence",
                Verdict::Warn,
                format!(
                    "RDB snapshots only (save \"{s}\"): a restart loses the grants made since \
                     the last snapshot, and a second holder can get in before the first hears; \
                     turn on appendonly"
                ),
            ),
            (Some(_), Some(_)) => Check::new(
                "persistence",
                Verdict::Fail,
                "no persistence (appendonly no, save \"\"): a restart forgets every lock, and \
                 a second holder can get in before the first hears; turn on appendonly",
            ),
            _ => Check::new(
                "persistence",
                Verdict::Unknown,
                format!(
                    "{}: ask whether a restart keeps keys (it must, or a second holder can \
                     get in)",
                    unread.unwrap_or_default()
                ),
            ),
        });
        let limit = self.config("maxmemory").await;
        let policy = self.config("maxmemory-policy").await;
        let unread = limit.as_ref().err().or(policy.as_ref().err()).cloned();
        let limit = limit.ok().and_then(|m| m.parse::<u64>().ok());
        let policy = policy.ok();
        out.push(match (limit, policy.as_deref()) {
            (_, Some("noeviction")) => Check::new(
                "eviction",
                Verdict::Pass,
                "maxmemory-policy noeviction: lock keys are never evicted",
            ),
            (Some(0), Some(p)) => Check::new(
                "eviction",
                Verdict::Pass,
                format!(
                    "no memory limit (maxmemory 0), so nothing is evicted; with a limit, \
                     maxmemory-policy {p} would evict lock keys: make it noeviction then"
                ),
            ),
            (Some(m), Some(p)) => Check::new(
                "eviction",
                Verdict::Fail,
                format!(
                    "maxmemory {m} with maxmemory-policy {p}: under memory pressure Redis may \
                     evict a lock key, which frees the lock early; set noeviction"
                ),
            ),
            _ => Check::new(
                "eviction",
                Verdict::Unknown,
                format!(
                    "{}: ask whether keys may be evicted (they must not be)",
                    unread.unwrap_or_default()
                ),
            ),
        });
        // One reply on a single server; on a Cluster, one per primary
        // (a map of node to reply): the fewest replicas count.
        let info = self
            .node
            .run(|mut c| async move {
                redis::cmd("INFO")
                    .arg("replication")
                    .query_async::<redis::Value>(&mut c)
                    .await
            })
            .await;
        out.push(match info {
            Ok(info) => {
                let mut texts = Vec::new();
                collect_text(&info, &mut texts);
                let field = |info: &str, k: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
                        .map(|v| v.trim().to_owned())
                };
                let role = texts
                    .first()
                    .and_then(|t| field(t, "role"))
                    .unwrap_or_else(|| "?".into());
                let replicas: u32 = texts
                    .iter()
                    .map(|t| {
                        field(t, "connected_slaves")
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(0)
                    })
                    .min()
                    .unwrap_or(0);
                let fails_over = !matches!(self.node.target, Target::Fixed(_));
                if self.min_replicas > replicas {
                    Check::new(
                        "replication",
                        Verdict::Fail,
                        format!(
                            "min_replicas={} but the master has {replicas} replica(s): every \
                             grant waits for replicas that are not there, and is given back",
                            self.min_replicas
                        ),
                    )
                } else if fails_over && self.min_replicas == 0 {
                    Check::new(
                        "replication",
                        Verdict::Warn,
                        format!(
                            "{replicas} replica(s), min_replicas=0: a failover may promote a \
                             replica that never got a grant and let a second holder in; \
                             min_replicas=1 narrows the window"
                        ),
                    )
                } else {
                    Check::new(
                        "replication",
                        Verdict::Pass,
                        format!(
                            "role {role}, {replicas} replica(s), min_replicas={}",
                            self.min_replicas
                        ),
                    )
                }
            }
            Err(e) => Check::new(
                "replication",
                Verdict::Unknown,
                format!("INFO replication failed: {e}"),
            ),
        });
        let time = self
            .node
            .run(|mut c| async move { redis::cmd("TIME").query_async::<(i64, i64)>(&mut c).await })
            .await;
        out.push(match time {
            Ok((s, us)) => clock_offset(s * 1_000_000 + us),
            Err(e) => Check::new("clock", Verdict::Unknown, format!("TIME: {e}")),
        });
        Ok(out)
    }
}

/// The text replies in `v`: itself, or each value of a map (a Cluster's
/// reply per node).
fn collect_text(v: &redis::Value, out: &mut Vec<String>) {
    match v {
        redis::Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => out.push(s.clone()),
        redis::Value::VerbatimString { text, .. } => out.push(text.clone()),
        redis::Value::Map(kv) => kv.iter().for_each(|(_, v)| collect_text(v, out)),
        redis::Value::Array(vs) => vs.iter().for_each(|v| collect_text(v, out)),
        _ => {}
    }
}
