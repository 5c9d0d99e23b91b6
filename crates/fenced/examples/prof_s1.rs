// Scratch: S1 loop for profiling (not committed).
fn main() {
    let rt = if std::env::var("CT").is_ok() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    rt.block_on(body());
}

async fn body() {
    let url = std::env::args().nth(1).unwrap();
    let n: u64 = std::env::args().nth(2).unwrap().parse().unwrap();
    let mode = std::env::args().nth(3).unwrap_or_default();
    let client = fenced::Client::connect(&url).await.unwrap();
    let mut lock = client.mutex("prof:s1").unwrap();
    if mode == "fixed" {
        lock = lock.fixed_lease(std::time::Duration::from_secs(30));
    }
    for _ in 0..200 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    let t = std::time::Instant::now();
    for _ in 0..n {
        if mode == "try" {
            let g = lock.try_acquire().await.unwrap().unwrap();
            g.release().await.unwrap();
        } else {
            let g = lock.acquire().await.unwrap();
            g.release().await.unwrap();
        }
    }
    let e = t.elapsed();
    println!(
        "{n} iterations in {e:?}: {:.1} us/iter",
        e.as_secs_f64() * 1e6 / n as f64
    );
}
