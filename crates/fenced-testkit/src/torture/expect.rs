//! What each backend claims under each fault: RELIABILITY.md's table of
//! expected outcomes, as code the torture run is judged by.

use serde::{Deserialize, Serialize};

/// A fault the torture driver can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL the process holding the lock.
    Kill,
    /// SIGSTOP the holder for longer than its lease (a GC pause), then SIGCONT.
    Pause,
    /// Reset every TCP connection of the holder (in the proxy).
    Cut,
    /// Blackhole the holder's connections past its lease, then heal: the
    /// held-back bytes arrive late, as after a partition.
    Partition,
    /// SIGKILL the server and start it again on the same data.
    Restart,
    /// SIGKILL the leader of a ZooKeeper ensemble or etcd cluster, restart it later.
    Leader,
    /// SIGKILL the master of a Sentinel group; a replica is promoted.
    Failover,
    /// Step a waiting worker's wall clock forward past the lease
    /// (libfaketime), then back: only SQLite reads the client's clock;
    /// on every other backend it must change nothing.
    Clock,
    /// SIGSTOP every server of the topology for a third of the time it
    /// takes to free a dead holder's lock, then SIGCONT: a VM or storage
    /// stall, while clients time out. Leases and sessions outlive it.
    Stall,
    /// SIGKILL a majority of an ensemble or cluster (the leader and one
    /// more), then start them again: no quorum, so no grants meanwhile.
    Quorum,
    /// Every worker's traffic, in the proxy, 10–50 ms late and now and
    /// then a retransmission (200 ms) more, for a lease or session and
    /// more: a slow, lossy network, short of a partition.
    Slow,
    /// Every worker starts acquisitions of the lock from several tasks of
    /// its client at once and drops them at random points (a `timeout`
    /// around `acquire`, `try_acquire` or `acquire_timeout`), and drops
    /// some of what it wins mid-release, for a lease or session and more:
    /// a cancellation storm under contention. Nothing may leak.
    Storm,
    /// Fill the server's connection limit at its default (Redis
    /// `maxclients`, PostgreSQL and MariaDB `max_connections`, ZooKeeper's
    /// `maxClientCnxns` per address) with idle connections of the test
    /// kit's own, and reset every worker's connections, so that they must
    /// reconnect to a full server; for a lease or session and more, the
    /// hoard taking each slot that frees, then free them all.
    Exhaust,
    /// Fill the file system under SQLite's lock file (a tmpfs of the
    /// run's own) to its last byte for a lease and more, then free it.
    Disk,
}

impl Fault {
    /// Every fault, in the order a mixed run cycles through them (and the
    /// claims table lists them).
    pub const ALL: [Fault; 14] = [
        Fault::Kill,
        Fault::Pause,
        Fault::Cut,
        Fault::Partition,
        Fault::Restart,
        Fault::Leader,
        Fault::Failover,
        Fault::Clock,
        Fault::Stall,
        Fault::Quorum,
        Fault::Slow,
        Fault::Exhaust,
        Fault::Disk,
        // Last: the cleanup of what a storm's dropped calls leave is
        // bounded only while the server answers, and a fault right after
        // it (a full server) would hold that cleanup back.
        Fault::Storm,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Cut => "cut",
            Fault::Partition => "partition",
            Fault::Restart => "restart",
            Fault::Leader => "leader",
            Fault::Failover => "failover",
            Fault::Clock => "clock",
            Fault::Stall => "stall",
            Fault::Quorum => "quorum",
            Fault::Slow => "slow",
            Fault::Storm => "storm",
            Fault::Exhaust => "exhaust",
            Fault::Disk => "disk",
        }
    }

    /// Parses a name from [`Fault::name`].
    pub fn parse(s: &str) -> Result<Fault, String> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                format!("unknown fault {s:?}; the faults are {}", names.join(", "))
            })
    }

    /// Whether the fault needs the holder's traffic to pass the proxy.
    pub fn needs_proxy(self) -> bool {
        matches!(
            self,
            Fault::Cut | Fault::Partition | Fault::Slow | Fault::Exhaust
        )
    }

    /// Whether the fault strikes one worker, a holder or a waiter, rather
    /// than the servers or every worker.
    pub fn needs_victim(self) -> bool {
        !self.needs_spawn() && !matches!(self, Fault::Slow | Fault::Storm)
    }

    /// Whether the fault acts on servers the run started (`--spawn`).
    pub fn needs_spawn(self) -> bool {
        matches!(
            self,
            Fault::Restart
                | Fault::Leader
                | Fault::Failover
                | Fault::Stall
                | Fault::Quorum
                | Fault::Exhaust
                | Fault::Disk
        )
    }
}

/// Backends that share a set of guarantees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// SQLite.
    Sqlite,
    /// One Redis master.
    Redis,
    /// Redis behind Sentinel.
    Sentinel,
    /// Redis Cluster.
    Cluster,
    /// RedLock over independent masters.
    RedLock,
    /// ZooKeeper.
    ZooKeeper,
    /// etcd.
    Etcd,
    /// PostgreSQL or MariaDB with the lease table.
    SqlLease,
    /// PostgreSQL advisory locks or MariaDB `GET_LOCK`: held by a session.
    SqlAdvisory,
}

impl Family {
    /// The family of a backend URL, or `None` for `memory://` (one process only).
    pub fn of(url: &str) -> Option<Family> {
        let scheme = url.split("://").next().unwrap_or("");
        let advisory = url.contains("mode=advisory");
        // By the backend table's name, so every scheme of a backend maps.
        Some(match fenced::backend_for_scheme(scheme)?.name {
            "sqlite" => Family::Sqlite,
            "redis" => Family::Redis,
            "redis+sentinel" => Family::Sentinel,
            "redis+cluster" => Family::Cluster,
            "redlock" => Family::RedLock,
            "zk" => Family::ZooKeeper,
            "etcd" => Family::Etcd,
            "postgres" | "mysql" if advisory => Family::SqlAdvisory,
            "postgres" | "mysql" => Family::SqlLease,
            _ => return None,
        })
    }
}

/// Whether a figure is a promise or only measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Claim {
    /// The backend promises it: a breach fails the run.
    Must,
    /// Broken by design under this fault: measured and reported.
    Measured,
}

/// The claims of one backend under one set of faults. Whatever the fault,
/// a fenced register never accepts a stale write (I1) and nothing is left
/// held at the end (I5): those are always [`Claim::Must`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expect {
    /// I2: no two holders at once, and so no lost update.
    pub exclusion: Claim,
    /// I7: tokens for a name never go down.
    pub tokens: Claim,
    /// I4: a hold whose write was refused has had its lost signal.
    pub signals: Claim,
    /// I3: after a fault, a waiter gets the lock within the backend's bound.
    pub liveness: Claim,
}

impl Expect {
    const ALL_MUST: Expect = Expect {
        exclusion: Claim::Must,
        tokens: Claim::Must,
        signals: Claim::Must,
        liveness: Claim::Must,
    };

    /// The weaker of two claims on each figure: a run with several faults
    /// promises only what every one of them allows.
    pub fn and(self, o: Expect) -> Expect {
        let w = |a: Claim, b: Claim| if a == Claim::Must { b } else { a };
        Expect {
            exclusion: w(self.exclusion, o.exclusion),
            tokens: w(self.tokens, o.tokens),
            signals: w(self.signals, o.signals),
            liveness: w(self.liveness, o.liveness),
        }
    }
}

/// What `family` claims under `fault` (`None`: contention only), or
/// `None` when the fault does not apply to it.
pub fn expect(family: Family, fault: Option<Fault>) -> Option<Expect> {
    use Claim::Measured as M;
    use Family as B;
    let must = Expect::ALL_MUST;
    let advisory = family == B::SqlAdvisory;
    Some(match fault {
        None | Some(Fault::Kill) => must,
        // A stopped holder still believes it holds when it wakes; the
        // fence must refuse its late write. A session lock (advisory)
        // stays with the stopped process: nobody else gets in, by design,
        // but a holder whose lease ran out on its own clock and writes
        // anyway can still lose an update the fence cannot see (the next
        // holder has not written yet).
        Some(Fault::Pause) if advisory => Expect {
            exclusion: M,
            liveness: M,
            ..must
        },
        Some(Fault::Pause) => Expect {
            exclusion: M,
            ..must
        },
        // A reset connection: sessions and leases outlive it, except a
        // session lock, which the server drops with the session.
        Some(Fault::Cut) => match family {
            B::Sqlite => return None,
            B::SqlAdvisory => Expect {
                exclusion: M,
                ..must
            },
            _ => must,
        },
        // Cut off past the lease: the server gives the lock away while the
        // holder cannot hear it; a session lock is never given away.
        Some(Fault::Partition) => match family {
            B::Sqlite => return None,
            B::SqlAdvisory => Expect {
                exclusion: M,
                liveness: M,
                ..must
            },
            _ => Expect {
                exclusion: M,
                ..must
            },
        },
        Some(Fault::Restart) => match family {
            B::Sqlite | B::Sentinel => return None,
            // No persistence: the lock is gone, and a second holder may
            // get in before the first hears it; tokens still rise (never
            // below the server's clock in µs).
            B::Redis | B::Cluster => Expect {
                exclusion: M,
                ..must
            },
            // One master of five forgets: a majority may form again
            // without the holder; its token counter restarts too.
            B::RedLock => Expect {
                exclusion: M,
                tokens: M,
                ..must
            },
            // The server dropped the session that held the lock; the
            // holder hears it only when it next talks to the server.
            B::SqlAdvisory => Expect {
                exclusion: M,
                ..must
            },
            B::SqlLease | B::ZooKeeper | B::Etcd => must,
        },
        // SQLite's leases end by the host's wall clock: a process whose
        // clock runs ahead sees a live lease as over. Every other backend
        // keeps time by the server's clock and the client's monotonic
        // one: a client's wall clock must change nothing there.
        Some(Fault::Clock) => match family {
            B::Sqlite => Expect {
                exclusion: M,
                ..must
            },
            _ => must,
        },
        Some(Fault::Leader) => match family {
            B::ZooKeeper | B::Etcd => must,
            _ => return None,
        },
        // Shorter than any lease or session: nothing may break.
        Some(Fault::Stall) => match family {
            B::Sqlite => return None,
            _ => must,
        },
        // No majority, no grant: nobody gets in until the quorum is back,
        // and a holder whose session could not be kept alive meanwhile is
        // told (the short profile's outage, 1 s, is shorter than any
        // session: there the holder keeps the lock through it).
        Some(Fault::Quorum) => match family {
            B::ZooKeeper | B::Etcd => must,
            _ => return None,
        },
        // Slower than the lease needs, never as slow as a partition.
        Some(Fault::Slow) => match family {
            B::Sqlite => return None,
            _ => must,
        },
        // Dropped calls withdraw what they asked for, on every backend.
        Some(Fault::Storm) => must,
        // A full server refuses new connections with an error: a client
        // cut off from it is told at once, keeps no hold past its lease,
        // and takes the lock again once slots free. A session lock goes
        // with the reset connection, and another client may get in (a
        // slot that frees) before the holder hears it, as under `cut`.
        // etcd has no connection limit; the Redis topologies behind
        // several addresses, and SQLite, have no proxy to reset through.
        Some(Fault::Exhaust) => match family {
            B::Redis | B::SqlLease | B::ZooKeeper => must,
            B::SqlAdvisory => Expect {
                exclusion: M,
                ..must
            },
            B::Sqlite | B::Sentinel | B::Cluster | B::RedLock | B::Etcd => return None,
        },
        // No write reaches the lock file: nobody is granted the lock, a
        // holder whose renewals fail is told before its lease ends, and
        // the file works again once space frees.
        Some(Fault::Disk) => match family {
            B::Sqlite => must,
            _ => return None,
        },
        // Asynchronous replication: the promoted replica may not have the
        // lock (tokens still rise: they follow the server's clock). The
        // lost signal holds: clients follow the newest master the
        // sentinels name and leave a replaced one at `+switch-master`,
        // where a hold that did not survive is found missing.
        Some(Fault::Failover) => match family {
            B::Sentinel => Expect {
                exclusion: M,
                ..must
            },
            _ => return None,
        },
    })
}

const FAMILIES: [(Family, &str); 9] = [
    (Family::Sqlite, "SQLite"),
    (Family::Redis, "Redis"),
    (Family::Sentinel, "Sentinel"),
    (Family::Cluster, "Cluster"),
    (Family::RedLock, "RedLock"),
    (Family::ZooKeeper, "ZooKeeper"),
    (Family::Etcd, "etcd"),
    (Family::SqlLease, "SQL lease table"),
    (Family::SqlAdvisory, "SQL advisory"),
];

/// The claims as a Markdown table, faults by backend: `P` where every
/// invariant must hold; `F(…)` where the invariants named are measured
/// only (broken by design); `L(I3)` where liveness is given up; `–`
/// where the fault does not apply. docs/backends.md's guarantee table is this
/// text (a test checks it).
pub fn claims_markdown() -> String {
    let mut out = String::from("| fault |");
    for (_, n) in FAMILIES {
        out += &format!(" {n} |");
    }
    out += "\n|---|";
    out += &"---|".repeat(FAMILIES.len());
    out += "\n";
    let faults = std::iter::once(None).chain(Fault::ALL.into_iter().map(Some));
    for f in faults {
        out += &format!("| {} |", f.map_or("contention, no fault", Fault::name));
        for (fam, _) in FAMILIES {
            let cell = match expect(fam, f) {
                None => "–".to_owned(),
                Some(e) => {
                    let m = |c: Claim, id: &'static str| (c == Claim::Measured).then_some(id);
                    let f: Vec<&str> =
                        [m(e.exclusion, "I2"), m(e.tokens, "I7"), m(e.signals, "I4")]
                            .into_iter()
                            .flatten()
                            .collect();
                    let mut cell = String::new();
                    if !f.is_empty() {
                        cell += &format!("F({})", f.join(","));
                    }
                    if e.liveness == Claim::Measured {
                        cell += "L(I3)";
                    }
                    if cell.is_empty() {
                        "P".to_owned()
                    } else {
                        cell
                    }
                }
            };
            out += &format!(" {cell} |");
        }
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weakest_claim_wins() {
        let pause = expect(Family::Redis, Some(Fault::Pause)).unwrap();
        let kill = expect(Family::Redis, Some(Fault::Kill)).unwrap();
        assert_eq!(kill.and(pause).exclusion, Claim::Measured);
        assert_eq!(kill.and(pause).tokens, Claim::Must);
        assert_eq!(pause.and(kill), kill.and(pause));
    }

    #[test]
    fn families_and_faults_parse() {
        assert_eq!(
            Family::of("postgres://h/db?mode=advisory"),
            Some(Family::SqlAdvisory)
        );
        assert_eq!(Family::of("mysql://h/db"), Some(Family::SqlLease));
        assert_eq!(Family::of("memory://x"), None);
        assert_eq!(Fault::parse("pause"), Ok(Fault::Pause));
        assert!(Fault::parse("nap").unwrap_err().contains("kill, pause"));
        assert_eq!(expect(Family::Sqlite, Some(Fault::Cut)), None);
        assert_eq!(expect(Family::Redis, Some(Fault::Leader)), None);
        assert_eq!(expect(Family::Redis, Some(Fault::Quorum)), None);
        assert_eq!(Fault::parse("stall"), Ok(Fault::Stall));
    }
}
