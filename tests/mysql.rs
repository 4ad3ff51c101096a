//! The MySQL/MariaDB suite: a database per test on the server named by `MYSQL_URL`.

#![cfg(feature = "mysql")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use diesel::result::Error;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::{ErrorClass, Outcome, classify, idempotent};
use tokio::sync::Notify;

use common::{Credit, Gate, TestDb};

#[derive(Clone)]
struct MysqlDb {
    server: String,
    database: String,
}

impl MysqlDb {
    async fn create(test: &str) -> Option<Self> {
        let url = common::server_url("MYSQL_URL", "mysql://root@127.0.0.1:3306/test")?;
        let (server, _) = url
            .rsplit_once('/')
            .expect("MYSQL_URL ends with /<database>");
        let db = Self {
            server: server.to_owned(),
            database: format!("inbox_test_{test}"),
        };
        db.admin(&format!(
            "DROP DATABASE IF EXISTS {0}; CREATE DATABASE {0}",
            db.database
        ))
        .await;
        Some(db)
    }

    async fn admin(&self, sql: &str) {
        let mut conn = AsyncMysqlConnection::establish(&format!("{}/mysql", self.server))
            .await
            .expect("connect to MySQL");
        conn.batch_execute(sql)
            .await
            .expect("administer test database");
    }
}

impl TestDb for MysqlDb {
    type Conn = AsyncMysqlConnection;

    async fn connect(&self) -> Self::Conn {
        AsyncMysqlConnection::establish(&format!("{}/{}", self.server, self.database))
            .await
            .expect("connect to MySQL")
    }

    async fn count(conn: &mut Self::Conn, sql: &str) -> Result<i64, Error> {
        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
            "({sql})"
        )))
        .get_result(conn)
        .await
    }

    async fn waiting_marker_inserts(&self) -> Option<i64> {
        // A marker insert cannot finish while another transaction holds the key, so a
        // connection still inside one is waiting for it.
        let query = "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                     WHERE DB = DATABASE() AND INFO LIKE 'INSERT INTO `inbox`%'";
        let mut conn = self.connect().await;
        Some(Self::count(&mut conn, query).await.expect("processlist"))
    }

    async fn cleanup(self) {
        self.admin(&format!("DROP DATABASE IF EXISTS {}", self.database))
            .await;
    }
}

common_scenarios!(MysqlDb::create);

/// Waits until `n` connections of this test are inside a marker insert.
async fn wait_for_marker_inserts(db: &MysqlDb, n: i64) {
    for _ in 0..200 {
        if db.waiting_marker_inserts().await >= Some(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} transactions never waited for the marker's lock");
}

#[idempotent(consumer = "deadlock-swallowing", key = credit.message_id.as_str())]
async fn deadlock_swallowing_credit(
    conn: &mut AsyncMysqlConnection,
    credit: &Credit,
    first_lock_held: &Notify,
) -> Result<(), Error> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 0")
        .await?;
    first_lock_held.notify_one();
    // Deadlocks with the test's blocker. InnoDB rolls this whole transaction back, and
    // the handler carries on as if nothing happened.
    let _ignored = conn
        .batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        .await;
    Ok(())
}

/// A deadlock ends a MySQL transaction at once. A handler that swallows the error must
/// not be reported `Processed`: its marker went with the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swallowed_deadlock_is_not_reported_processed() {
    let Some(db) = MysqlDb::create("swallowed_deadlock").await else {
        return;
    };
    common::create_tables(&db, 6).await;
    let mut blocker = db.connect().await;
    // Locks more rows than the handler will, so that InnoDB picks the handler's
    // transaction as the deadlock's victim.
    blocker
        .batch_execute("BEGIN; UPDATE accounts SET balance = balance + 10 WHERE id BETWEEN 1 AND 5")
        .await
        .unwrap();
    let first_lock_held = Arc::new(Notify::new());
    let handler = tokio::spawn({
        let (db, first_lock_held) = (db.clone(), Arc::clone(&first_lock_held));
        async move {
            let mut conn = db.connect().await;
            deadlock_swallowing_credit(&mut conn, &Credit::new(0), &first_lock_held).await
        }
    });
    first_lock_held.notified().await;
    blocker
        .batch_execute("UPDATE accounts SET balance = balance + 10 WHERE id = 0")
        .await
        .expect("the handler, not the blocker, is the deadlock's victim");
    blocker.batch_execute("COMMIT").await.unwrap();

    let error = handler.await.unwrap().expect_err("not committed");
    assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
    let mut conn = db.connect().await;
    assert_eq!(
        MysqlDb::count(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .unwrap(),
        0
    );
    assert_eq!(common::balances(&db, 2).await, vec![10, 10]);
    db.cleanup().await;
}

/// Three instances race on one key while the first rolls back: InnoDB can deadlock the
/// two waiters (1213). The loser's error is transient, and redelivering it still gives
/// exactly one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_way_deadlock_is_transient_and_retry_is_exactly_once() {
    let Some(db) = MysqlDb::create("three_way_deadlock").await else {
        return;
    };
    let attempts = 10;
    common::create_tables(&db, attempts).await;
    let mut deadlocks = 0;
    for n in 0..attempts {
        let message = Credit::new(n);
        let gate = Gate::held(true);
        let mut first_conn = db.connect().await;
        let first = tokio::spawn({
            let (gate, message) = (gate.clone(), message.clone());
            async move { common::gated_credit(&mut first_conn, &message, &gate).await }
        });
        gate.entered.notified().await;
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (db, message) = (db.clone(), message.clone());
                tokio::spawn(async move {
                    let mut conn = db.connect().await;
                    let result = common::credit(&mut conn, &message).await;
                    (conn, result)
                })
            })
            .collect();
        wait_for_marker_inserts(&db, 2).await;
        gate.release.notify_one();
        assert!(matches!(
            first.await.unwrap(),
            Err(Error::RollbackTransaction)
        ));

        let mut processed = 0;
        for waiter in waiters {
            let (mut conn, mut result) = waiter.await.unwrap();
            while let Err(error) = &result {
                assert_eq!(classify(error), ErrorClass::Transient, "{error}");
                deadlocks += 1;
                result = common::credit(&mut conn, &message).await;
            }
            processed += usize::from(result.unwrap() == Outcome::Processed(()));
        }
        assert_eq!(
            processed, 1,
            "attempt {n}: exactly one waiter processes the message"
        );
    }
    assert!(
        deadlocks > 0,
        "no attempt deadlocked: the scenario did not reproduce"
    );
    assert_eq!(
        common::balances(&db, attempts).await,
        vec![1; attempts as usize]
    );
    db.cleanup().await;
}
