//! A flash sale (the seeds' 秒杀) with striped locks: one stock of items
//! split into segments, each with its own lock and its own counter in a
//! fenced register, so buyers on different segments proceed at once and
//! no segment ever sells more than it has.
//!
//! ```sh
//! cargo run -p fenced --example flash_sale                 # memory://
//! FENCED_BACKEND=sqlite:///tmp/sale.db cargo run -p fenced --example flash_sale
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const STOCK: i64 = 200;
const SEGMENTS: u32 = 8;
const BUYERS: u64 = 32;
const TRIES: u64 = 20;

/// Runs the sale on the backend `url`; how many items were sold.
pub async fn run(url: &str) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    let client = fenced::Client::connect(url).await?;
    let sale = format!("sale-{}", std::process::id());
    let stock = client.striped(&sale, SEGMENTS)?;
    // Each segment holds its share of the stock, in a register its lock fences.
    for i in 0..SEGMENTS {
        let guard = stock.segment(i)?.acquire().await?;
        let share =
            STOCK / i64::from(SEGMENTS) + i64::from(i64::from(i) < STOCK % i64::from(SEGMENTS));
        client
            .register(&format!("{sale}:left:{i}"))?
            .write(&guard, share.to_string())
            .await?;
        guard.release().await?;
    }
    let sold = Arc::new(AtomicU64::new(0));
    let mut buyers = Vec::new();
    for buyer in 0..BUYERS {
        let (client, stock, sale, sold) =
            (client.clone(), stock.clone(), sale.clone(), sold.clone());
        buyers.push(tokio::spawn(async move {
            for attempt in 0..TRIES {
                // A buyer's tries spread over the segments.
                let i = stock.index_for(format!("buyer-{buyer}-{attempt}"));
                let guard = stock.segment(i)?.acquire().await?;
                let left = client.register(&format!("{sale}:left:{i}"))?;
                let n = left.read_i64().await?.unwrap_or(0);
                if n > 0 {
                    // Written with the guard's token: a buyer paused past its
                    // lease could not write a stale count over a newer one.
                    left.write(&guard, (n - 1).to_string()).await?;
                    sold.fetch_add(1, Ordering::Relaxed);
                }
                guard.release().await?;
            }
            Ok::<_, fenced::Error>(())
        }));
    }
    for b in buyers {
        b.await??;
    }
    let sold = sold.load(Ordering::Relaxed);
    println!(
        "{BUYERS} buyers, {} tries, {SEGMENTS} segments: sold {sold} of {STOCK}",
        BUYERS * TRIES
    );
    client.close().await;
    if sold as i64 > STOCK {
        return Err(format!("oversold: {sold} of {STOCK}").into());
    }
    Ok(sold)
}

#[allow(dead_code)] // also compiled into the examples' test, which has its own entry
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("FENCED_BACKEND").unwrap_or_else(|_| "memory://sale".to_owned());
    run(&url).await?;
    Ok(())
}
