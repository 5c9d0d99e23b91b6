//! `fenced status NAME`.

use crate::connect;
use clap::Args;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// The lock's name.
    name: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// A lock's status as one JSON object (`status --json`, and each line of
/// `list --json`).
fn status_json(name: &str, backend: &str, st: &fenced::LockStatus) -> serde_json::Value {
    let holders: Vec<_> = st
        .holders
        .iter()
        .map(|h| {
            serde_json::json!({
                "owner": h.owner,
                "mode": h.mode.to_string(),
                "token": h.token,
                "lease_left_ms": lease_ms(h.lease_left),
                "holder": h.holder.as_ref().map(|w| serde_json::json!({
                    "host": w.host,
                    "pid": w.pid,
                    "command": w.command,
                    "granted_at_ms": w.granted_at_ms(),
                })),
            })
        })
        .collect();
    serde_json::json!({
        "name": name,
        "backend": backend,
        "held": !st.is_free(),
        "holders": holders,
        "waiters": st.waiters,
        "last_token": st.last_token,
    })
}

/// A lease left in ms; `null` for a session lock's, which has none while
/// its session lives.
fn lease_ms(left: std::time::Duration) -> Option<u64> {
    (left != std::time::Duration::MAX).then_some(left.as_millis() as u64)
}

/// A lease left as `status` and `list` print it.
fn lease_text(left: std::time::Duration) -> String {
    match lease_ms(left) {
        Some(_) => format!("{:.1}s", left.as_secs_f64()),
        None => "session".to_owned(),
    }
}

/// Who holds: `pid@host command` as the hold recorded it, else (a foreign
/// client's hold, an advisory lock) the owner id the backend shows.
fn holder_text(h: &fenced::HolderInfo) -> String {
    match &h.holder {
        Some(w) => format!("{}@{} {}", w.pid, w.host, w.command)
            .trim_end()
            .to_owned(),
        None => h.owner.clone(),
    }
}

/// How long ago the hold was granted, by this host's clock against the
/// holder's, in its two largest units (`42s`, `12m5s`, `3h12m`, `2d3h`);
/// `-` where the hold recorded no time.
fn held_for(h: &fenced::HolderInfo) -> String {
    let Some(w) = &h.holder else {
        return "-".to_owned();
    };
    let s = std::time::SystemTime::now()
        .duration_since(w.granted_at)
        .map_or(0, |d| d.as_secs());
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// The columns of `list` and `top`.
pub(crate) const HEADER: [&str; 7] = [
    "NAME",
    "MODE",
    "TOKEN",
    "LEASE LEFT",
    "WAITERS",
    "HELD FOR",
    "HOLDER",
];

/// A row per holder of each lock (one for a free lock with waiters), as
/// `list` and `top` show them under [`HEADER`].
pub(crate) fn table_rows(locks: &[fenced::LockEntry]) -> Vec<[String; 7]> {
    let mut rows = Vec::new();
    for l in locks {
        let waiters = l.status.waiters.to_string();
        if l.status.holders.is_empty() {
            let dash = || "-".to_owned();
            rows.push([
                l.name.clone(),
                "free".into(),
                dash(),
                dash(),
                waiters.clone(),
                dash(),
                dash(),
            ]);
        }
        for h in &l.status.holders {
            rows.push([
                l.name.clone(),
                h.mode.to_string(),
                h.token.to_string(),
                lease_text(h.lease_left),
                waiters.clone(),
                held_for(h),
                holder_text(h),
            ]);
        }
    }
    rows
}

#[derive(Args, Debug)]
pub(crate) struct ListArgs {
    /// Only the locks whose names start with this.
    #[arg(default_value = "")]
    prefix: String,
    /// Print one JSON object per lock, a line each, instead of a table.
    #[arg(long)]
    json: bool,
}

/// `fenced list [PREFIX]`: every lock held or waited for, a line per
/// holder (a free lock with waiters gets one line too).
pub(crate) async fn list(backend: Option<String>, args: ListArgs) -> anyhow::Result<ExitCode> {
    let client = connect(backend.as_deref()).await?;
    let locks = client.list(&args.prefix).await;
    let url = client.url().to_owned();
    client.close().await;
    let locks = locks?;
    if args.json {
        for l in &locks {
            println!("{}", status_json(&l.name, &url, &l.status));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = vec![HEADER.map(str::to_owned)];
    rows.extend(table_rows(&locks));
    if locks.is_empty() {
        eprintln!(
            "no lock held or waited for{}",
            if args.prefix.is_empty() {
                String::new()
            } else {
                format!(" under {:?}", args.prefix)
            }
        );
        return Ok(ExitCode::SUCCESS);
    }
    let widths: Vec<usize> = (0..HEADER.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn status(backend: Option<String>, args: StatusArgs) -> anyhow::Result<ExitCode> {
    let client = connect(backend.as_deref()).await?;
    let st = client.status(&args.name).await?;
    if args.json {
        println!("{}", status_json(&args.name, client.url(), &st));
    } else if st.is_free() {
        println!(
            "{}: free (last token {}, {} waiting)",
            args.name, st.last_token, st.waiters
        );
    } else {
        println!("{}: held ({} waiting)", args.name, st.waiters);
        for h in &st.holders {
            println!(
                "  holder {}  {}  token {}  lease left {}",
                h.owner,
                h.mode,
                h.token,
                lease_text(h.lease_left)
            );
            if h.holder.is_some() {
                println!("    {} (for {})", holder_text(h), held_for(h));
            }
        }
    }
    client.close().await;
    // As `test`: scripts write `if fenced status NAME; then ...`.
    Ok(if st.is_free() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[derive(Args, Debug)]
pub(crate) struct UnlockArgs {
    /// The lock's name.
    name: String,
    /// Break the lock even though it is held: its holders' lost signals
    /// fire at their next renewal, and `fenced run` kills their commands.
    #[arg(long)]
    force: bool,
}

/// `fenced unlock NAME`: an operator's break-lock. A held lock is broken
/// only with `--force`, after its holders are shown.
pub(crate) async fn unlock(backend: Option<String>, args: UnlockArgs) -> anyhow::Result<ExitCode> {
    let client = connect(backend.as_deref()).await?;
    let st = client.status(&args.name).await?;
    if st.is_free() {
        println!("{}: free; nothing to unlock", args.name);
        client.close().await;
        return Ok(ExitCode::SUCCESS);
    }
    for h in &st.holders {
        println!(
            "{}: held by {}  {}  token {}  lease left {}",
            args.name,
            holder_text(h),
            h.mode,
            h.token,
            lease_text(h.lease_left)
        );
    }
    if !args.force {
        client.close().await;
        return Err(crate::usage(format!(
            "{} is held; breaking it lets another holder in beside one that may still be \
             working: add --force to break it",
            args.name
        )));
    }
    let dropped = client.mutex(&args.name)?.force_unlock().await?;
    println!("{}: broke {dropped} hold(s)", args.name);
    client.close().await;
    Ok(ExitCode::SUCCESS)
}
