//! The torture suite's short profile: every topology the test kit starts
//! (RELIABILITY.md), every fault it takes at least once, judged by what
//! the backend claims. Each topology runs twice: once with the faults
//! under which it promises everything (a breach of any invariant fails
//! the run), once with the faults that break exclusion or liveness by
//! design (there only the fence, the lost signal and the cleanup must
//! hold, and the overlap must show, or the fault had no teeth).
//!
//! The long profile is `scripts/torture-long`; its table is in
//! docs/guarantees.md.

use fenced_testkit::torture::{Claim, Fault, expect, topology::Topology};
use std::process::Command;

/// Seconds a fault takes in the driver's schedule, roughly.
fn cost(f: Fault) -> u64 {
    match f {
        Fault::Kill | Fault::Cut => 3,
        Fault::Pause | Fault::Partition | Fault::Clock => 7,
        Fault::Restart | Fault::Leader => 9,
        Fault::Failover => 14,
    }
}

fn run(topology: Topology, faults: &[Fault]) -> serde_json::Value {
    let list: Vec<&str> = faults.iter().map(|f| f.name()).collect();
    let secs = 3 + faults.iter().map(|&f| cost(f)).sum::<u64>() + 8;
    let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
        .args([
            "torture",
            "--spawn",
            topology.name(),
            "--json",
            "--clients",
            "4",
        ])
        .arg("--faults")
        .arg(if list.is_empty() {
            "none".to_owned()
        } else {
            list.join(",")
        })
        .arg("--duration")
        .arg(format!("{secs}s"))
        .output()
        .expect("run fenced torture");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "fenced torture --spawn {} printed no report ({e}): {stdout}\n{}",
            topology.name(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success() && report["pass"] == true,
        "torture {} {list:?} broke a claim: {:#}\n{}",
        topology.name(),
        report["breaches"],
        report
    );
    for f in &list {
        assert!(
            report["injected"][f].as_u64() >= Some(1),
            "{f} not injected: {report}"
        );
    }
    assert!(report["findings"]["holds"].as_u64() > Some(10), "{report}");
    report
}

fn torture(topology: Topology) {
    let family = topology.family();
    let all_must = |f: &Fault| {
        let e = expect(family, Some(*f)).expect("the topology takes it");
        [e.exclusion, e.tokens, e.signals, e.liveness] == [Claim::Must; 4]
    };
    let (strict, loose): (Vec<Fault>, Vec<Fault>) =
        topology.faults().into_iter().partition(all_must);
    let r = run(topology, &strict);
    assert_eq!(r["findings"]["overlaps"], 0, "{r}");
    assert_eq!(r["findings"]["lost_updates"], 0, "{r}");
    if loose.is_empty() {
        return;
    }
    let r = run(topology, &loose);
    // A pause or partition past the lease, or a clock run ahead, must
    // show. Where the lock goes to another meanwhile (a lease), two
    // workers believed they held it at once; where it stays with the
    // stopped or cut-off session (an advisory lock, liveness given up),
    // the victim's own lease ran out and its lost signal fired.
    let teeth = |f: &Fault| matches!(f, Fault::Pause | Fault::Partition | Fault::Clock);
    let e = loose
        .iter()
        .filter(|f| teeth(f))
        .map(|&f| expect(family, Some(f)).expect("the topology takes it"))
        .next();
    match e {
        Some(e) if e.liveness == Claim::Must => {
            assert!(
                r["findings"]["overlaps"].as_u64() >= Some(1),
                "the fault had no teeth: {r}"
            );
        }
        Some(_) => {
            assert!(
                r["findings"]["signals_fired"].as_u64() >= Some(1),
                "the fault had no teeth: {r}"
            );
        }
        None => {}
    }
}

macro_rules! topologies {
    ($($(#[$m:meta])* $name:ident => $t:ident),* $(,)?) => {
        $(
            $(#[$m])*
            #[test]
            fn $name() {
                torture(Topology::$t);
            }
        )*
    };
}

topologies! {
    sqlite => Sqlite,
    redis => Redis,
    redis_aof => RedisAof,
    sentinel => Sentinel,
    cluster => Cluster,
    redlock => RedLock,
    postgres => Postgres,
    postgres_advisory => PostgresAdvisory,
    mariadb => Mariadb,
    mariadb_advisory => MariadbAdvisory,
    zookeeper => Zookeeper,
    zookeeper_ensemble => Zookeeper3,
    #[cfg(feature = "etcd")]
    etcd => Etcd,
    #[cfg(feature = "etcd")]
    etcd_cluster => Etcd3,
}

/// The README's guarantee table is the one the suite judges by.
#[test]
fn readme_guarantee_table_is_the_claims() {
    let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
        .args(["torture", "--claims"])
        .output()
        .expect("run fenced torture --claims");
    let table = String::from_utf8(out.stdout).expect("utf-8");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("read README.md");
    assert!(
        readme.contains(table.trim()),
        "README.md's guarantee table differs from `fenced torture --claims`:\n{table}"
    );
}
