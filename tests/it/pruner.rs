//! The background pruner: prunes on its schedule, and stops when asked, at once.

use std::time::Duration;

use diesel::sqlite::SqliteConnection;
use diesel_async::SimpleAsyncConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_inbox::testing::{TestDatabase, select_i64};
use diesel_inbox::{Pace, Pruner, prune_paced};

type Conn = SyncConnectionWrapper<SqliteConnection>;

async fn markers(conn: &mut Conn) -> i64 {
    select_i64(conn, "SELECT COUNT(*) FROM inbox")
        .await
        .unwrap()
}

/// `old` markers an hour old and two new ones.
async fn inbox_with_old_markers(test: &str, old: usize) -> (TestDatabase<Conn>, Conn) {
    let db = TestDatabase::<Conn>::sqlite(test).await.unwrap();
    let mut conn = db.connect().await.unwrap();
    let old: Vec<String> = (0..old)
        .map(|n| format!("('old-{n}', 'c', datetime('now', '-1 hour'))"))
        .collect();
    conn.batch_execute(&format!(
        "INSERT INTO inbox (message_id, consumer, processed_at) VALUES {}; \
         INSERT INTO inbox (message_id, consumer) VALUES ('new-1', 'c'), ('new-2', 'c');",
        old.join(", ")
    ))
    .await
    .unwrap();
    (db, conn)
}

type BoxedConnecting = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<Conn, diesel_inbox::testing::TestDatabaseError>>
            + Send,
    >,
>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_on_its_schedule_and_stops_when_asked() {
    let (db, mut conn) = inbox_with_old_markers("pruner", 3_000).await;
    let pruner = Pruner::spawn(
        db.clone(),
        Duration::from_millis(20),
        Duration::from_secs(60),
    );
    tokio::time::timeout(Duration::from_secs(30), async {
        while markers(&mut conn).await > 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the old markers are pruned");
    pruner.shut_down().await;
    assert_eq!(
        markers(&mut conn).await,
        2,
        "markers inside the window stay"
    );

    // Shutting down does not wait for the next run.
    let idle = Pruner::spawn(
        db.clone(),
        Duration::from_secs(3_600),
        Duration::from_secs(60),
    );
    tokio::time::timeout(Duration::from_secs(5), idle.shut_down())
        .await
        .expect("shuts down between runs at once");
    drop(conn);
    db.cleanup().await.unwrap();
}

/// A run waiting for a connection (a pool whose connections the handlers hold) does not
/// hold up shutting down: it hung until a connection came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_does_not_wait_for_a_connection() {
    let never_connects = || -> BoxedConnecting { Box::pin(std::future::pending()) };
    let pruner = Pruner::spawn(
        never_connects,
        Duration::from_millis(10),
        Duration::from_secs(60),
    );
    // Past the first run's start, into its wait for a connection.
    tokio::time::sleep(Duration::from_millis(200)).await;
    tokio::time::timeout(Duration::from_secs(5), pruner.shut_down())
        .await
        .expect("shuts down while waiting for a connection");
}

/// A paced run rests between its batches, and shutting down ends it there rather than
/// after every batch: with a rest of hours, only the first batch is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_ends_a_paced_run_between_its_batches() {
    let (db, mut conn) = inbox_with_old_markers("pruner_paced", 3_000).await;
    let pruner = Pruner::spawn_paced(
        db.clone(),
        Duration::from_millis(20),
        Duration::from_secs(60),
        Pace::resting(1_000_000),
    );
    tokio::time::timeout(Duration::from_secs(30), async {
        while markers(&mut conn).await == 3_002 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the first batch is pruned");
    tokio::time::timeout(Duration::from_secs(5), pruner.shut_down())
        .await
        .expect("shuts down in the rest, at once");
    assert_eq!(
        markers(&mut conn).await,
        2_002,
        "one batch of 1,000 ids deleted"
    );
    drop(conn);
    db.cleanup().await.unwrap();
}

/// At any pace, a prune deletes the markers outside the window and nothing else, and
/// says how many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_prune_deletes_what_a_flat_out_one_does() {
    let (db, mut conn) = inbox_with_old_markers("prune_paced", 2_500).await;
    let deleted = prune_paced(&mut conn, Duration::from_secs(60), Pace::resting(1))
        .await
        .unwrap();
    assert_eq!(deleted, 2_500);
    assert_eq!(markers(&mut conn).await, 2);
    drop(conn);
    db.cleanup().await.unwrap();
}

/// An owned pool is all a pruner needs, deadpool's or bb8's: one line, where a closure
/// over an owned pool (`move || pool.get()`) does not compile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owned_pool_is_all_a_pruner_needs() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::{bb8, deadpool};

    let (db, mut conn) = inbox_with_old_markers("pruner_pools", 100).await;
    let manager = || AsyncDieselConnectionManager::<Conn>::new(db.url());
    let deadpool = deadpool::Pool::builder(manager()).build().unwrap();
    let bb8 = bb8::Pool::builder().build(manager()).await.unwrap();
    let pruners = [
        Pruner::spawn(deadpool, Duration::from_millis(20), Duration::from_secs(60)),
        Pruner::spawn(bb8, Duration::from_millis(20), Duration::from_secs(60)),
    ];
    tokio::time::timeout(Duration::from_secs(30), async {
        while markers(&mut conn).await > 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the old markers are pruned");
    for pruner in pruners {
        pruner.shut_down().await;
    }
    drop(conn);
    db.cleanup().await.unwrap();
}
