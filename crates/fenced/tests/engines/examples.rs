//! The examples, run as their `main`s would run them, against real
//! servers: each example's code is compiled in here.

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/leader.rs"]
mod leader;

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/flash_sale.rs"]
mod flash_sale;

#[cfg(feature = "postgres")]
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/axum_orders.rs"]
mod axum_orders;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_example_hands_leadership_over_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    leader::run(&url).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flash_sale_example_sells_the_stock_exactly_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    // 32 buyers × 20 tries for 200 items: everything sells, nothing more.
    assert_eq!(flash_sale::run(&url).await.unwrap(), 200);
}

/// Sixteen requests to pay one order at once pay it once, with the locks
/// and the orders in one PostgreSQL, as the example runs by default.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_example_pays_an_order_once() {
    let pg = fenced_testkit::servers::postgres::PgServer::start();
    let orders = axum_orders::Orders {
        locks: fenced::Client::connect(&pg.url()).await.unwrap(),
        db: sqlx::PgPool::connect(&pg.url()).await.unwrap(),
    };
    axum_orders::create_table(&orders.db).await.unwrap();
    assert_eq!(
        axum_orders::pay_at_once(orders.clone(), 1, 16)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        axum_orders::pay_at_once(orders.clone(), 1, 4)
            .await
            .unwrap(),
        0,
        "paid already"
    );
    assert_eq!(
        axum_orders::pay_at_once(orders.clone(), 2, 16)
            .await
            .unwrap(),
        1
    );
    orders.locks.close().await;
}
