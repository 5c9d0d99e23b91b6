//! A leader-elected worker: several instances campaign for one
//! leadership; the leader works (here: a few ticks) while its guard is
//! held and stops the moment it hears the hold is lost; then it resigns
//! and another instance takes over. Three instances run in one process
//! here, each with a client of its own as separate processes would have.
//!
//! ```sh
//! cargo run -p fenced --example leader                     # memory://
//! FENCED_BACKEND=redis://127.0.0.1:6379 cargo run -p fenced --features redis --example leader
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How many instances believe they lead: never more than one.
static LEADING: AtomicUsize = AtomicUsize::new(0);

const INSTANCES: usize = 3;
const TICKS: u32 = 3;

async fn instance(url: String, election: String, id: usize) -> fenced::Result<()> {
    let client = fenced::Client::connect(&url).await?;
    let election = client.election(&election)?;
    // Waits until this instance leads.
    let leadership = election.campaign(format!("instance-{id}")).await?;
    assert_eq!(
        LEADING.fetch_add(1, Ordering::SeqCst),
        0,
        "two leaders at once"
    );
    println!(
        "instance {id} leads (token {})",
        leadership.guard().fencing_token()
    );
    for tick in 1..=TICKS {
        tokio::select! {
            reason = leadership.guard().lost() => {
                LEADING.fetch_sub(1, Ordering::SeqCst);
                println!("instance {id} lost the leadership ({reason}); stopping");
                return Ok(());
            }
            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                println!("instance {id} works: tick {tick}");
            }
        }
    }
    // Done for now: the next instance takes over at once.
    LEADING.fetch_sub(1, Ordering::SeqCst);
    leadership.resign().await?;
    client.close().await;
    Ok(())
}

/// Runs the instances on the backend `url`, until each has led once.
pub async fn run(url: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let election = format!("report-writer-{}", std::process::id());
    let instances: Vec<_> = (0..INSTANCES)
        .map(|id| tokio::spawn(instance(url.to_owned(), election.clone(), id)))
        .collect();
    for i in instances {
        i.await??;
    }
    println!("every instance led once, one at a time");
    Ok(())
}

#[allow(dead_code)] // also compiled into the examples' test, which has its own entry
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("FENCED_BACKEND").unwrap_or_else(|_| "memory://leader".to_owned());
    run(&url).await
}
