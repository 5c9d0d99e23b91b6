//! `fenced doctor [URL]`: what in the server's (or the host's) settings
//! weakens the guarantees.

use crate::connect;
use clap::Args;
use fenced::Verdict;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub(crate) struct DoctorArgs {
    /// The backend to check (else --backend, $FENCED_BACKEND, or the
    /// host's lock file).
    #[arg(value_name = "URL")]
    url: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn doctor(backend: Option<String>, args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let client = connect(args.url.as_deref().or(backend.as_deref())).await?;
    let checks = client.doctor().await;
    let url = client.url().to_owned();
    client.close().await;
    let checks = checks?;
    let failed = checks.iter().any(|c| c.verdict == Verdict::Fail);
    if args.json {
        let list: Vec<_> = checks
            .iter()
            .map(|c| {
                serde_json::json!({
                    "check": c.name,
                    "verdict": c.verdict.to_string(),
                    "detail": c.detail,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "backend": url, "checks": list, "pass": !failed })
        );
    } else {
        println!("{url}");
        let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for c in &checks {
            println!(
                "  {:<7} {:<width$}  {}",
                c.verdict.to_string().to_uppercase(),
                c.name,
                c.detail
            );
        }
        if checks.is_empty() {
            println!("  nothing to check on this backend");
        }
    }
    // A failing check is a finding, as a failing test: non-zero.
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
