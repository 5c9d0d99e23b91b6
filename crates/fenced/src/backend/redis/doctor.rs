//! `fenced doctor` on Redis: persistence, eviction, replication, clock.

use super::*;
use crate::doctor::{Check, Verdict, clock_offset};

impl RedisBackend {
    /// One `CONFIG GET` value; `None` where CONFIG is refused (managed
    /// Redis often renames or disables it).
    async fn config(&self, key: &'static str) -> Option<String> {
        self.node
            .run(move |mut c| async move {
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg(key)
                    .query_async::<Vec<String>>(&mut c)
                    .await
            })
            .await
            .ok()
            .and_then(|v| v.into_iter().nth(1))
    }

    pub(super) async fn checks(&self) -> Result<Vec<Check>> {
        let mut out = Vec::new();
        let (aof, save, fsync) = (
            self.config("appendonly").await,
            self.config("save").await,
            self.config("appendfsync").await,
        );
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
                "CONFIG GET is refused here (a managed Redis?): ask whether a restart keeps keys",
            ),
        });
        let limit = self
            .config("maxmemory")
            .await
            .and_then(|m| m.parse::<u64>().ok());
        let policy = self.config("maxmemory-policy").await;
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
                "CONFIG GET is refused here: ask whether keys may be evicted (they must not be)",
            ),
        });
        let info = self
            .node
            .run(|mut c| async move {
                redis::cmd("INFO")
                    .arg("replication")
                    .query_async::<String>(&mut c)
                    .await
            })
            .await;
        out.push(match info {
            Ok(info) => {
                let field = |k: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
                        .map(|v| v.trim().to_owned())
                };
                let role = field("role").unwrap_or_else(|| "?".into());
                let replicas: u32 = field("connected_slaves")
                    .and_then(|n| n.parse().ok())
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
            .await?;
        out.push(clock_offset(time.0 * 1_000_000 + time.1));
        Ok(out)
    }
}
