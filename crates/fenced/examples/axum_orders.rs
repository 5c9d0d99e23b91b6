//! An axum handler that takes a lock per order and fences its PostgreSQL
//! write: `POST /orders/{id}/pay` pays an order once, however many
//! requests for it arrive at once, on however many instances of the
//! service; and a holder paused past its lease cannot write over a newer
//! holder, because the `UPDATE` only applies with a token at least as high
//! as the one the row last saw.
//!
//! ```sh
//! # Serve, with the locks in the same PostgreSQL (or FENCED_BACKEND=redis://…):
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres \
//!   cargo run -p fenced --features postgres --example axum_orders -- serve 127.0.0.1:3000
//! curl -X POST 127.0.0.1:3000/orders/1/pay
//! # Or send 16 requests for one order at once and count the payments:
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres \
//!   cargo run -p fenced --features postgres --example axum_orders
//! ```

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use sqlx::PgPool;
use std::time::Duration;

/// What every handler shares: the lock client and the database.
#[derive(Clone)]
pub struct Orders {
    /// The locks, one per order.
    pub locks: fenced::Client,
    /// The orders.
    pub db: PgPool,
}

/// The orders table, with the fence column that refuses stale writers.
pub async fn create_table(db: &PgPool) -> sqlx::Result<()> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (
            id    BIGINT PRIMARY KEY,
            state TEXT NOT NULL DEFAULT 'new',
            fence BIGINT NOT NULL DEFAULT 0
        )",
    )
    .execute(db)
    .await?;
    Ok(())
}

/// The service's routes.
pub fn app(orders: Orders) -> axum::Router {
    axum::Router::new()
        .route("/orders/{id}/pay", post(pay))
        .with_state(orders)
}

async fn pay(State(o): State<Orders>, Path(id): Path<i64>) -> (StatusCode, String) {
    let error = |e: &dyn std::fmt::Display| (StatusCode::SERVICE_UNAVAILABLE, e.to_string());
    // One lock per order; a request waits up to 2 s for the one before it.
    let lock = match o.locks.mutex(&format!("order:{id}")) {
        Ok(lock) => lock.lease(Duration::from_secs(10)),
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()),
    };
    let guard = match lock.acquire_timeout(Duration::from_secs(2)).await {
        Ok(Some(guard)) => guard,
        Ok(None) => return (StatusCode::CONFLICT, "order is busy; retry".into()),
        Err(e) => return error(&e),
    };
    let token = guard.fencing_token() as i64;
    let state: Option<String> = match sqlx::query_scalar("SELECT state FROM orders WHERE id = $1")
        .bind(id)
        .fetch_optional(&o.db)
        .await
    {
        Ok(state) => state,
        Err(e) => return error(&e),
    };
    let reply = match state.as_deref() {
        None => (StatusCode::NOT_FOUND, format!("no order {id}")),
        Some("paid") => (StatusCode::CONFLICT, format!("order {id} is already paid")),
        Some(_) => {
            // ... charge the customer here ...
            // The write carries the token: a holder whose lease ran out
            // while it was paused gets 0 rows, not a lost update.
            let written = sqlx::query(
                "UPDATE orders SET state = 'paid', fence = $2 WHERE id = $1 AND fence <= $2",
            )
            .bind(id)
            .bind(token)
            .execute(&o.db)
            .await;
            match written {
                Ok(r) if r.rows_affected() == 1 => (StatusCode::OK, format!("order {id} paid")),
                Ok(_) => (StatusCode::CONFLICT, "a newer holder wrote first".into()),
                Err(e) => error(&e),
            }
        }
    };
    if let Err(e) = guard.release().await {
        tracing::warn!(error = %e, "release failed; the lease will free the lock");
    }
    reply
}

/// Sends `requests` payments for one new order at once, through the
/// router as a server would; how many of them paid it.
pub async fn pay_at_once(orders: Orders, order: i64, requests: usize) -> sqlx::Result<usize> {
    use tower::ServiceExt;
    sqlx::query("INSERT INTO orders (id) VALUES ($1) ON CONFLICT (id) DO NOTHING")
        .bind(order)
        .execute(&orders.db)
        .await?;
    let app = app(orders);
    let calls: Vec<_> = (0..requests)
        .map(|_| {
            let req = axum::http::Request::post(format!("/orders/{order}/pay"))
                .body(axum::body::Body::empty())
                .expect("a request");
            tokio::spawn(app.clone().oneshot(req))
        })
        .collect();
    let mut paid = 0;
    for call in calls {
        let reply = call.await.expect("the handler ran").expect("infallible");
        if reply.status() == StatusCode::OK {
            paid += 1;
        }
    }
    Ok(paid)
}

#[allow(dead_code)] // also compiled into the example test, which has its own entry
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db_url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL to a PostgreSQL URL (postgres://user@host/db)")?;
    let locks_url = std::env::var("FENCED_BACKEND").unwrap_or_else(|_| db_url.clone());
    let orders = Orders {
        locks: fenced::Client::connect(&locks_url).await?,
        db: PgPool::connect(&db_url).await?,
    };
    create_table(&orders.db).await?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [serve, addr] if serve == "serve" => {
            let listener = tokio::net::TcpListener::bind(addr.as_str()).await?;
            println!("serving POST /orders/{{id}}/pay on {addr}");
            axum::serve(listener, app(orders)).await?;
        }
        [] => {
            let order = i64::from(std::process::id());
            let paid = pay_at_once(orders.clone(), order, 16).await?;
            println!("16 requests to pay order {order} at once: paid {paid} time(s)");
            orders.locks.close().await;
        }
        _ => return Err("usage: axum_orders [serve ADDR]".into()),
    }
    Ok(())
}
