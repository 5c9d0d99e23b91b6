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

pub(crate) async fn status(backend: Option<String>, args: StatusArgs) -> anyhow::Result<ExitCode> {
    let client = connect(backend.as_deref()).await?;
    let st = client.status(&args.name).await?;
    if args.json {
        let holders: Vec<_> = st
            .holders
            .iter()
            .map(|h| {
                serde_json::json!({
                    "owner": h.owner,
                    "mode": h.mode.to_string(),
                    "token": h.token,
                    "lease_left_ms": h.lease_left.as_millis() as u64,
                })
            })
            .collect();
        let out = serde_json::json!({
            "name": args.name,
            "backend": client.url(),
            "held": !st.is_free(),
            "holders": holders,
            "waiters": st.waiters,
            "last_token": st.last_token,
        });
        println!("{out}");
    } else if st.is_free() {
        println!(
            "{}: free (last token {}, {} waiting)",
            args.name, st.last_token, st.waiters
        );
    } else {
        println!("{}: held ({} waiting)", args.name, st.waiters);
        for h in &st.holders {
            println!(
                "  holder {}  {}  token {}  lease left {:.1}s",
                h.owner,
                h.mode,
                h.token,
                h.lease_left.as_secs_f64()
            );
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
            "{}: held by {}  {}  token {}  lease left {:.1}s",
            args.name,
            h.owner,
            h.mode,
            h.token,
            h.lease_left.as_secs_f64()
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
