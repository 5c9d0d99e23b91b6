//! The comparison table (medians over the rounds) and its plot.

use crate::libs::Engine;
use crate::scenarios::{Plan, Row};
use anyhow::Result;
use std::fmt::Write;

/// The table's columns: a figure and how it is printed.
const COLUMNS: [(&str, &str); 11] = [
    ("S1 ×Y", "S1 ×Y"),
    ("S1 ×Y current_thread", "S1 ×Y (current_thread)"),
    ("S1 p50 RT", "S1 p50 (round trips)"),
    (
        "S1 client CPU µs",
        "S1 client CPU per op (µs, current_thread)",
    ),
    ("S2 ×Y", "S2 ×Y"),
    ("S2 run length", "S2 run length"),
    ("S2 p99 wait ms", "S2 p99 wait (ms)"),
    ("S2 lost updates", "S2 lost updates"),
    ("S3 ×Y", "S3 ×Y"),
    ("S4 p50 RT", "S4 p50 (round trips)"),
    ("S4 hand-overs", "S4 hand-overs"),
];

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// The median of `what` for `row` on `engine` over the rounds; for lost
/// updates, the most of any round (one bad round must show).
fn figure(rows: &[Row], engine: Engine, row: &str, what: &str) -> Option<f64> {
    let values: Vec<f64> = rows
        .iter()
        .filter(|r| r.engine == engine && r.row == row && r.what == what)
        .map(|r| r.value)
        .collect();
    if what == "S2 lost updates" {
        return values.into_iter().reduce(f64::max);
    }
    median(values)
}

/// The rows of `engine` in the order they first appear.
fn row_names(rows: &[Row], engine: Engine) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.engine == engine && r.row != "limit")
    {
        if !names.contains(&r.row) {
            names.push(r.row.clone());
        }
    }
    // fenced's own bench last, as the extra rows they are.
    names.sort_by_key(|n| n == "fenced bench");
    names
}

/// Markdown: per engine, the limit of each round and one line per library.
pub(crate) fn table(rows: &[Row], plan: &Plan, rounds: usize, args: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "`fenced-peers {args}`: {rounds} round(s) of {} s per scenario, medians (lost \
         updates: the most of any round); ×Y is a rate as a ratio to the engine's limit Y \
         of its round, round trips are times in units of 1/Y; S4 is the time from the \
         holder's call to release to the waiter's grant.\n",
        plan.secs.as_secs()
    );
    for (engine, limit) in [
        (
            Engine::Redis,
            "Y = `redis-benchmark -c 1 -n 20000 -t set` (requests/s)",
        ),
        (
            Engine::Postgres,
            "Y = one-row upserts per second on one connection",
        ),
    ] {
        let names = row_names(rows, engine);
        if names.is_empty() {
            continue;
        }
        let ys: Vec<String> = rows
            .iter()
            .filter(|r| r.engine == engine && r.row == "limit")
            .map(|r| format!("{:.0}", r.value))
            .collect();
        let _ = writeln!(
            s,
            "### {engine:?}\n\n{limit}: {} by round.\n",
            ys.join(", ")
        );
        let _ = write!(s, "| library |");
        for (_, head) in COLUMNS {
            let _ = write!(s, " {head} |");
        }
        let _ = write!(s, "\n|---|");
        for _ in COLUMNS {
            let _ = write!(s, "---|");
        }
        s.push('\n');
        for name in names {
            let _ = write!(s, "| {name} |");
            for (what, _) in COLUMNS {
                match figure(rows, engine, &name, what) {
                    Some(v) if what == "S2 lost updates" || what == "S4 hand-overs" => {
                        let _ = write!(s, " {v:.0} |");
                    }
                    Some(v) => {
                        let _ = write!(s, " {v:.2} |");
                    }
                    None => s.push_str(" – |"),
                }
            }
            s.push('\n');
        }
        s.push('\n');
    }
    s
}

/// Four panels, one per scenario's headline figure, a bar per library.
pub(crate) fn plot(rows: &[Row], path: &std::path::Path) -> Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 2));
    let mut bars: Vec<(String, Engine)> = Vec::new();
    for e in [Engine::Redis, Engine::Postgres] {
        bars.extend(row_names(rows, e).into_iter().map(|n| (n, e)));
    }
    let heads = [
        ("S1 ×Y", "S1 uncontended, ×Y (higher is better)"),
        ("S2 ×Y", "S2 8 processes, one lock, ×Y (higher is better)"),
        (
            "S3 ×Y",
            "S3 8 processes, 1,024 locks, ×Y (higher is better)",
        ),
        (
            "S4 p50 RT",
            "S4 hand-over p50, round trips (lower is better)",
        ),
    ];
    for (panel, (what, caption)) in panels.iter().zip(heads) {
        let values: Vec<(String, Engine, f64)> = bars
            .iter()
            .filter_map(|(n, e)| Some((n.clone(), *e, figure(rows, *e, n, what)?)))
            .collect();
        let n = values.len().max(1);
        let max = values.iter().map(|v| v.2).fold(0.0, f64::max).max(1e-3);
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(28)
            .y_label_area_size(290)
            .build_cartesian_2d(0f64..max * 1.15, 0f64..n as f64)?;
        let labels: Vec<String> = values
            .iter()
            .map(|(name, e, _)| format!("{name} ({e:?})"))
            .collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n * 2 + 1)
            .y_label_formatter(&|y| {
                let i = (n as f64 - y - 0.5).round();
                let centred = (n as f64 - y - 0.5 - i).abs() < 1e-6;
                match (centred, labels.get(i as usize)) {
                    (true, Some(s)) => s.clone(),
                    _ => String::new(),
                }
            })
            .draw()?;
        chart.draw_series(values.iter().enumerate().map(|(i, (name, e, v))| {
            let y = (n - 1 - i) as f64;
            let color = match (name.starts_with("fenced"), e) {
                (true, _) => RGBColor(200, 80, 40),
                (false, Engine::Redis) => RGBColor(40, 110, 180),
                (false, Engine::Postgres) => RGBColor(60, 150, 90),
            };
            Rectangle::new([(0.0, y + 0.15), (*v, y + 0.85)], color.filled())
        }))?;
    }
    root.present()?;
    Ok(())
}
