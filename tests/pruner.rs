//! The background pruner: prunes on its schedule, and stops when asked, at once.

#![cfg(all(feature = "sqlite", feature = "pruner", feature = "testing"))]

use std::time::Duration;

use diesel::sqlite::SqliteConnection;
use diesel_async::SimpleAsyncConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_inbox::Pruner;
use diesel_inbox::testing::{TestDatabase, select_i64};

type Conn = SyncConnectionWrapper<SqliteConnection>;

async fn markers(conn: &mut Conn) -> i64 {
    select_i64(conn, "SELECT COUNT(*) FROM inbox")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_on_its_schedule_and_stops_when_asked() {
    let db = TestDatabase::<Conn>::sqlite("pruner").await.unwrap();
    let mut conn = db.connect().await.unwrap();
    let old: Vec<String> = (0..3_000)
        .map(|n| format!("('old-{n}', 'c', datetime('now', '-1 hour'))"))
        .collect();
    conn.batch_execute(&format!(
        "INSERT INTO inbox (message_id, consumer, processed_at) VALUES {}; \
         INSERT INTO inbox (message_id, consumer) VALUES ('new-1', 'c'), ('new-2', 'c');",
        old.join(", ")
    ))
    .await
    .unwrap();

    let connect = {
        let db = db.clone();
        move || {
            let db = db.clone();
            async move { db.connect().await }
        }
    };
    let pruner = Pruner::spawn(
        connect.clone(),
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
    let idle = Pruner::spawn(connect, Duration::from_secs(3_600), Duration::from_secs(60));
    tokio::time::timeout(Duration::from_secs(5), idle.shut_down())
        .await
        .expect("shuts down between runs at once");
    drop(conn);
    db.cleanup().await.unwrap();
}
