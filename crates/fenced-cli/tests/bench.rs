//! `fenced bench` runs every scenario and its rows say what docs/bench-scenarios.md
//! asks; the figures themselves are never asserted (tests do not time).

use std::process::Command;

fn bench(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .expect("run fenced bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fenced bench {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON row ({e}): {l}")))
        .collect()
}

fn scenario<'a>(rows: &'a [serde_json::Value], s: &str) -> Vec<&'a serde_json::Value> {
    rows.iter().filter(|r| r["scenario"] == s).collect()
}

#[test]
fn every_scenario_runs_and_reports_what_it_must() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let plot = dir.path().join("bench.svg");
    let rows = bench(&[
        "--spawn",
        "sqlite",
        "s1",
        "s2",
        "s3",
        "s4",
        "s5",
        "f1",
        "--iterations",
        "200",
        "--duration",
        "2s",
        "--handoffs",
        "10",
        "--leases",
        "300",
        "--hold",
        "1s",
        "--processes",
        "3",
        "--plot",
        plot.to_str().expect("utf-8"),
    ]);
    for s in ["S1", "S2", "S3", "S4", "S5"] {
        let r = scenario(&rows, s);
        assert_eq!(r.len(), 1, "one {s} row: {rows:?}");
        assert_eq!(r[0]["target"], "sqlite", "{:?}", r[0]);
        assert!(
            r[0]["ops_per_sec"].as_f64().is_some() || s == "S4" || s == "S5",
            "{:?}",
            r[0]
        );
    }
    assert_eq!(scenario(&rows, "S1")[0]["iterations"], 200);
    assert_eq!(scenario(&rows, "S2")[0]["lost_updates"], 0);
    assert_eq!(scenario(&rows, "S4")[0]["handoffs"], 10);
    let s5 = scenario(&rows, "S5")[0];
    assert_eq!(
        (s5["leases"].as_u64(), s5["leases_lost"].as_u64()),
        (Some(300), Some(0))
    );
    let f1 = scenario(&rows, "F1");
    assert_eq!(f1.len(), 4, "{f1:?}");
    for r in f1.iter().filter(|r| r["mode"] != "none") {
        assert_eq!(
            (r["sold"].as_u64(), r["oversold"].as_u64()),
            (Some(1000), Some(0)),
            "{r}"
        );
    }
    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    assert!(
        svg.starts_with("<svg") && svg.contains("S1 acquire+release"),
        "{svg:.200}"
    );
    // The rows make the tables of docs/benchmarks.md.
    let jsonl = dir.path().join("rows.jsonl");
    let text: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
    std::fs::write(&jsonl, text.join("\n")).expect("write rows");
    let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
        .args(["bench", "--table"])
        .arg(&jsonl)
        .output()
        .expect("run fenced bench --table");
    let tables = String::from_utf8_lossy(&out.stdout);
    assert!(
        tables.contains("### S1") && tables.contains("| sqlite | segmented | 1000 | 0 |"),
        "{tables}"
    );
}

/// On a single server, S1 runs in slices between slices of the engine's
/// raw write loop, and its row carries its ratio to that loop.
#[test]
fn s1_is_measured_beside_the_raw_loop_of_the_same_server() {
    for (topology, ratio, engine) in [
        (
            "redis",
            "ratio_to_client_set_half",
            "SET over the redis crate",
        ),
        ("postgres", "ratio_to_limit", "INSERT INTO fenced_locks"),
    ] {
        let rows = bench(&["--spawn", topology, "s1", "--iterations", "200"]);
        let s1 = &scenario(&rows, "S1")[0];
        assert_eq!(s1["iterations"], 200, "{rows:?}");
        let r = s1[ratio].as_f64().unwrap_or(f64::NAN);
        assert!(r.is_finite() && r > 0.0, "{ratio} in {s1}");
        let raw: Vec<_> = rows
            .iter()
            .filter(|r| r["limit"] == true && r["command"].as_str().unwrap_or("").contains(engine))
            .collect();
        assert_eq!(raw.len(), 1, "one raw-loop row on {topology}: {rows:?}");
        assert!(raw[0]["ops_per_sec"].as_f64().unwrap_or(0.0) > 0.0);
    }
}

/// Multi-host URLs (RedLock, Sentinel, Cluster) have no single-server
/// limit to measure, and must not fail for it.
#[test]
fn multi_host_backends_bench_without_a_limit_row() {
    let rows = bench(&[
        "--spawn",
        "redlock",
        "s1",
        "s4",
        "--iterations",
        "100",
        "--handoffs",
        "5",
    ]);
    assert_eq!(scenario(&rows, "S1")[0]["target"], "redlock", "{rows:?}");
    assert!(rows.iter().all(|r| r["limit"] != true), "{rows:?}");
}

#[test]
fn bad_plot_path_is_refused_before_any_work() {
    let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
        .args([
            "--backend",
            "memory://x",
            "bench",
            "s1",
            "--plot",
            "out.png",
        ])
        .output()
        .expect("run fenced bench");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--plot writes SVG"), "{err}");
}

/// Without --json, a run ends with its tables (those of the scenarios it
/// ran), as `--table` prints them for docs/benchmarks.md.
#[test]
fn a_run_on_a_terminal_ends_with_its_tables() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
        .args([
            "--backend",
            &url,
            "bench",
            "s2",
            "--duration",
            "1s",
            "--processes",
            "2",
        ])
        .output()
        .expect("run fenced bench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("### S2 contended"), "{text}");
    assert!(text.contains("| sqlite | 2 | false |"), "{text}");
    assert!(
        !text.contains("### S3") && !text.contains("### F1"),
        "{text}"
    );
}
