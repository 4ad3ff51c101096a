//! The MySQL/MariaDB suite: a database per test on the server named by `MYSQL_URL`.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::result::Error;
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, RunQueryDsl as _, SimpleAsyncConnection,
};
use diesel_inbox::testing::{TestDatabase, select_i64};
use diesel_inbox::{ErrorClass, Outcome, classify, idempotent};
use tokio::sync::Notify;

use common::{Credit, Gate, TestDb, bounded};

#[derive(Clone)]
pub(crate) struct MysqlDb(TestDatabase<AsyncMysqlConnection>);

/// The test's database, or `None` when the suite is skipped.
pub(crate) async fn create(test: &str) -> Option<MysqlDb> {
    let url = common::server_url("MYSQL_URL", "mysql://root@127.0.0.1:3306/test")?;
    let db = TestDatabase::mysql(&url, test).await;
    Some(MysqlDb(db.expect("create the test database")))
}

impl TestDb for MysqlDb {
    type Conn = AsyncMysqlConnection;

    fn database(&self) -> &TestDatabase<AsyncMysqlConnection> {
        &self.0
    }

    async fn lock_waiters(&self) -> Option<i64> {
        // This test's transactions that InnoDB has queued behind another's lock, read
        // from the live status report. The information_schema views (INNODB_TRX,
        // INNODB_LOCK_WAITS) are a server-wide cache refreshed only once nobody has
        // read it for 100 ms, which tests polling side by side never allow.
        let mut conn = self.connect().await;
        let sessions: Vec<SessionId> = diesel::sql_query(
            "SELECT ID AS id FROM information_schema.PROCESSLIST WHERE DB = DATABASE()",
        )
        .load(&mut conn)
        .await
        .expect("this test's sessions");
        let status: Vec<EngineStatus> = diesel::sql_query("SHOW ENGINE INNODB STATUS")
            .load(&mut conn)
            .await
            .expect("InnoDB status");
        let report = status
            .into_iter()
            .next()
            .expect("one InnoDB status row")
            .status;
        let waiting = report
            .split("---TRANSACTION ")
            .filter(|transaction| transaction.contains("LOCK WAIT"))
            .filter_map(|transaction| {
                // "MySQL thread id N, …", or "MariaDB thread id N, …".
                let thread = transaction.split(" thread id ").nth(1)?;
                thread.split(',').next()?.trim().parse::<i64>().ok()
            })
            .filter(|thread| sessions.iter().any(|session| session.id == *thread))
            .count();
        Some(waiting as i64)
    }
}

#[derive(diesel::QueryableByName)]
struct SessionId {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
}

#[derive(diesel::QueryableByName)]
struct EngineStatus {
    #[diesel(sql_type = diesel::sql_types::Text, column_name = "Status")]
    status: String,
}

common_scenarios!(create);
// The outbox's transactions begin and commit whatever the session does between them:
// autocommit off with a transaction left open by a read (MySQL refused to set the
// isolation of the next transaction inside it), `COMMIT` chaining a new transaction,
// and each SQL mode (under `ORACLE`, `BEGIN` opens a PL/SQL block).
outbox_scenarios!(
    create,
    sessions = [
        "SET autocommit = 0",
        "SET completion_type = 'CHAIN'",
        "SET autocommit = 0, completion_type = 'CHAIN'",
        "SET sql_mode = 'ORACLE'",
        "SET sql_mode = 'ANSI'",
        "SET sql_mode = 'TRADITIONAL,NO_BACKSLASH_ESCAPES'",
        "SET sql_mode = 'MSSQL'",
        "SET sql_mode = 'EMPTY_STRING_IS_NULL,SIMULTANEOUS_ASSIGNMENT'",
        // The client's character set and the connection's apart: the server converts
        // parameters from the one to the other.
        "SET character_set_client = latin1",
        "SET collation_connection = utf8mb3_general_ci",
        "SET character_set_connection = utf16",
        // Every read of the relay's has a `LIMIT` of its own.
        "SET sql_select_limit = 0",
        "SET sql_safe_updates = 1",
    ],
);
batch_scenarios!(create, swallowed = "ROLLBACK");
verdict_scenarios!(
    create,
    lock_wait = "SET innodb_lock_wait_timeout = 1",
    read_only = "SET SESSION TRANSACTION READ ONLY",
    unreachable = AsyncMysqlConnection => "mysql://root@127.0.0.1:1/test",
);
key_scenarios!(
    create,
    common::keys::Storage {
        refuses_nul: false,
        stored_hex: "HEX(message_id)",
        expected_hex: common::keys::utf8_hex,
    };
    keys_are_stored_as_encoded => "SET NAMES utf8mb4",
    keys_are_stored_as_encoded_in_latin1 => "SET NAMES latin1",
    // The client's character set and the connection's apart: the server converts text
    // parameters from the one to the other.
    keys_are_stored_as_encoded_with_a_latin1_connection => "SET character_set_connection = latin1",
    keys_are_stored_as_encoded_with_a_utf8mb3_connection => "SET collation_connection = utf8mb3_general_ci",
    keys_are_stored_as_encoded_from_a_latin1_client => "SET character_set_client = latin1",
    // A connection in UTF-16: `UNHEX` of the hex digits converted into it read their
    // zero bytes, and every lookup by key found nothing.
    keys_are_stored_as_encoded_with_a_utf16_connection => "SET character_set_connection = utf16",
);

impl MysqlDb {
    /// The server's id for this connection, as `KILL QUERY` takes it.
    async fn connection_id(conn: &mut AsyncMysqlConnection) -> i64 {
        select_i64(conn, "SELECT CONNECTION_ID()")
            .await
            .expect("connection id")
    }

    pub(crate) async fn inbox_rows(&self) -> i64 {
        let mut conn = self.connect().await;
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .expect("count inbox")
    }
}

/// Waits until `n` connections of this test wait for a lock.
async fn wait_for_lock_waiters(db: &MysqlDb, n: i64) {
    for _ in 0..500 {
        if db.lock_waiters().await >= Some(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} transactions never waited for a lock");
}

/// Where [`deadlock_victim`] stops, for the test to arrange the deadlock around it.
#[derive(Default)]
struct DeadlockScript {
    /// The body holds its lock on account 0.
    first_lock_held: Notify,
    /// The body may go on to account 1, where the test's blocker waits for it.
    go: Notify,
    /// The body may return, once it has swallowed the deadlock.
    finish: Notify,
}

/// Credits account 0. With a script, it then walks into a deadlock on account 1 that
/// InnoDB resolves by rolling this transaction back. The error is propagated from a
/// nested `conn.transaction` when `nested`, and swallowed otherwise.
#[idempotent(consumer = "deadlock-victim", key = credit.message_id.as_str(), fast_path = false)]
async fn deadlock_victim(
    conn: &mut AsyncMysqlConnection,
    credit: &Credit,
    script: Option<&DeadlockScript>,
    nested: bool,
) -> Result<(), Error> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 0")
        .await?;
    let Some(script) = script else {
        return Ok(());
    };
    script.first_lock_held.notify_one();
    script.go.notified().await;
    let second_row = "UPDATE accounts SET balance = balance + 1 WHERE id = 1";
    if nested {
        conn.transaction(async |conn| conn.batch_execute(second_row).await)
            .await?;
    } else {
        let _ignored = conn.batch_execute(second_row).await;
        script.finish.notified().await;
        // Runs after InnoDB has ended the transaction: it must not commit on its own.
        conn.batch_execute("UPDATE accounts SET balance = balance + 100 WHERE id = 2")
            .await?;
    }
    Ok(())
}

/// Locks accounts 1 to 5, more rows than the victim holds, so that InnoDB picks the
/// victim's transaction when the two deadlock.
async fn blocker(db: &MysqlDb) -> AsyncMysqlConnection {
    let mut blocker = db.connect().await;
    blocker
        .batch_execute("BEGIN; UPDATE accounts SET balance = balance + 10 WHERE id BETWEEN 1 AND 5")
        .await
        .unwrap();
    blocker
}

/// The victim swallows the deadlock that rolled its transaction back, and meanwhile
/// another delivery of the same message, which was waiting for the victim's marker,
/// commits its own. The victim's commit check must not take that marker for its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swallowed_deadlock_is_not_reported_processed() {
    let Some(db) = create("swallowed_deadlock").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 6).await;
        let message = Credit::numbered(0);
        let mut blocker = blocker(&db).await;
        let script = Arc::new(DeadlockScript::default());
        let victim = tokio::spawn({
            let (db, script, message) = (db.clone(), Arc::clone(&script), message.clone());
            async move {
                let mut conn = db.connect().await;
                deadlock_victim(&mut conn, &message, Some(&script), false).await
            }
        });
        script.first_lock_held.notified().await;
        let redelivery = tokio::spawn({
            let (db, message) = (db.clone(), message.clone());
            async move {
                let mut conn = db.connect().await;
                deadlock_victim(&mut conn, &message, None, false).await
            }
        });
        wait_for_lock_waiters(&db, 1).await;
        script.go.notify_one();
        wait_for_lock_waiters(&db, 2).await;
        blocker
            .batch_execute("UPDATE accounts SET balance = balance + 10 WHERE id = 0")
            .await
            .expect("the victim, not the blocker, is the deadlock's victim");
        blocker.batch_execute("COMMIT").await.unwrap();
        assert_eq!(redelivery.await.unwrap().unwrap(), Outcome::Processed(()));
        script.finish.notify_one();

        let error = victim
            .await
            .unwrap()
            .expect_err("the victim committed nothing");
        assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
        assert_eq!(db.inbox_rows().await, 1);
        assert_eq!(
            common::balances(&db, 3).await,
            vec![11, 10, 10],
            "nothing the body ran after the deadlock is committed"
        );
    })
    .await;
    db.cleanup().await;
}

/// A deadlock inside a nested `conn.transaction` rolls back the whole transaction on
/// InnoDB; diesel's `ROLLBACK TO SAVEPOINT` then fails and its error replaces the
/// deadlock's. Still transient, and the retry applies the message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadlock_in_a_nested_transaction_is_transient() {
    let Some(db) = create("nested_deadlock").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 6).await;
        let message = Credit::numbered(0);
        let mut blocker = blocker(&db).await;
        let script = Arc::new(DeadlockScript::default());
        let victim = tokio::spawn({
            let (db, script, message) = (db.clone(), Arc::clone(&script), message.clone());
            async move {
                let mut conn = db.connect().await;
                let result = deadlock_victim(&mut conn, &message, Some(&script), true).await;
                (conn, result)
            }
        });
        script.first_lock_held.notified().await;
        script.go.notify_one();
        wait_for_lock_waiters(&db, 1).await;
        blocker
            .batch_execute("UPDATE accounts SET balance = balance + 10 WHERE id = 0")
            .await
            .expect("the victim, not the blocker, is the deadlock's victim");
        blocker.batch_execute("COMMIT").await.unwrap();

        let (mut conn, result) = victim.await.unwrap();
        let error = result.expect_err("the deadlock rolled everything back");
        assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
        assert_eq!(db.inbox_rows().await, 0);
        assert_eq!(
            deadlock_victim(&mut conn, &message, None, true)
                .await
                .unwrap(),
            Outcome::Processed(())
        );
        assert_eq!(common::balances(&db, 2).await, vec![11, 10]);
    })
    .await;
    db.cleanup().await;
}

/// Credits account 0, runs DDL, which commits the transaction implicitly on MySQL, then
/// succeeds or fails.
#[idempotent(consumer = "ddl-in-body", key = credit.message_id.as_str(), fast_path = false)]
async fn credit_with_ddl(
    conn: &mut AsyncMysqlConnection,
    credit: &Credit,
    fail: bool,
) -> Result<(), Error> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 0")
        .await?;
    conn.batch_execute("CREATE TABLE IF NOT EXISTS side_table (id INT)")
        .await?;
    if fail {
        return Err(Error::RollbackTransaction);
    }
    Ok(())
}

/// DDL commits the marker early. The crate cannot undo that, but must say so, instead of
/// returning the body's own error (whose redelivery would be a duplicate of half the
/// work) or `Processed` (the work was not atomic).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ddl_in_the_body_is_reported_as_committed_early() {
    let Some(db) = create("ddl_in_body").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut conn = db.connect().await;
        for (n, fail) in [(0, true), (1, false)] {
            let message = Credit::numbered(n);
            let error = credit_with_ddl(&mut conn, &message, fail)
                .await
                .expect_err("committed early");
            assert_eq!(classify(&error), ErrorClass::Permanent, "{error}");
            assert!(
                error
                    .to_string()
                    .contains("committed before the handler returned"),
                "{error}"
            );
            assert_eq!(
                credit_with_ddl(&mut conn, &message, fail).await.unwrap(),
                Outcome::Duplicate,
                "the marker is committed"
            );
        }
        assert_eq!(db.inbox_rows().await, 2);
        assert_eq!(common::balances(&db, 1).await, vec![2]);
        // The connection is usable afterwards.
        assert_eq!(
            common::credit(&mut conn, &Credit::numbered(0))
                .await
                .unwrap(),
            Outcome::Processed(())
        );
    })
    .await;
    db.cleanup().await;
}

/// DDL in the body commits the test transaction itself. The handler says so, and the
/// connection is refused from then on rather than trusted to be in a test transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ddl_in_a_test_transaction_ends_it_and_says_so() {
    let Some(db) = create("ddl_in_test_transaction").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut conn = db.connect().await;
        conn.begin_test_transaction().await.unwrap();
        let error = credit_with_ddl(&mut conn, &Credit::numbered(0), false)
            .await
            .expect_err("the test transaction ended");
        assert!(
            error.to_string().contains("test transaction ended"),
            "{error}"
        );
        let refused = common::credit(&mut conn, &Credit::numbered(1)).await;
        assert!(
            matches!(refused, Err(Error::BrokenTransactionManager)),
            "{refused:?}"
        );
        // An open transaction's locks would hold up the DROP DATABASE.
        drop(conn);
    })
    .await;
    db.cleanup().await;
}

/// At READ UNCOMMITTED a plain read sees another delivery's marker before it commits.
/// The fast path must wait for that delivery instead, and never answer `Duplicate` for
/// a marker that then rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fast_path_never_trusts_an_uncommitted_marker() {
    let Some(db) = create("read_uncommitted").await else {
        return;
    };
    bounded(async {
        let uncommitted = "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED";
        common::create_tables(&db, 2).await;
        for (n, first_commits) in [(0, false), (1, true)] {
            let conn_b = common::connect_with(&db, uncommitted).await;
            let (_, second) = common::overlap(&db, conn_b, n, first_commits, true).await;
            let expected = if first_commits {
                Outcome::Duplicate
            } else {
                Outcome::Processed(())
            };
            assert_eq!(second.expect("B"), expected, "A commits: {first_commits}");
        }
        assert_eq!(common::balances(&db, 2).await, vec![1, 1]);
    })
    .await;
    db.cleanup().await;
}

/// MariaDB's snapshot isolation, at the isolation level where it applies.
const SNAPSHOT_ISOLATION: &str = "SET SESSION innodb_snapshot_isolation = ON; \
     SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ";

/// Whether the server has MariaDB's `innodb_snapshot_isolation` (10.6.18, 10.11.8 and
/// later; MySQL has none): the tests of it are skipped where it has not.
async fn has_snapshot_isolation(conn: &mut AsyncMysqlConnection) -> bool {
    let query = "SELECT COUNT(*) FROM information_schema.global_variables \
         WHERE variable_name = 'INNODB_SNAPSHOT_ISOLATION'";
    let found = select_i64(conn, query)
        .await
        .expect("read the server's variables")
        > 0;
    if !found {
        eprintln!("SKIPPED: this server has no innodb_snapshot_isolation");
    }
    found
}

/// With MariaDB's snapshot isolation on (the default from 11.6), a delivery that waits
/// for another's marker still ends as `Duplicate` or `Processed`, never with a snapshot
/// conflict: nothing the call sends before its body reads a snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_delivery_meets_no_snapshot_conflict() {
    let Some(db) = create("snapshot_isolation").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 4).await;
        if !has_snapshot_isolation(&mut db.connect().await).await {
            return;
        }
        for (n, first_commits, reads_first) in [
            (0, false, false),
            (1, true, false),
            (2, false, true),
            (3, true, true),
        ] {
            let conn_b = common::connect_with(&db, SNAPSHOT_ISOLATION).await;
            let (_, second) = common::overlap(&db, conn_b, n, first_commits, reads_first).await;
            let expected = if first_commits {
                Outcome::Duplicate
            } else {
                Outcome::Processed(())
            };
            assert_eq!(
                second.expect("B"),
                expected,
                "A commits: {first_commits}, B reads first: {reads_first}"
            );
        }
        assert_eq!(common::balances(&db, 4).await, vec![1, 1, 1, 1]);
    })
    .await;
    db.cleanup().await;
}

/// At READ UNCOMMITTED a plain read sees another delivery's marker before it commits.
/// A batch that meets it must wait for that delivery, and never answer `Duplicate` for
/// a marker that then rolls back; nor `Processed` for one that commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_never_trusts_an_uncommitted_marker() {
    let uncommitted = "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED";
    for holder_commits in [false, true] {
        let Some(db) = create("batch_read_uncommitted").await else {
            return;
        };
        bounded(common::batch::mixed_batch_in_session(
            db.clone(),
            holder_commits,
            Some(uncommitted),
        ))
        .await;
        db.cleanup().await;
    }
}

/// A handler dropped while a statement it sent outside any transaction is in flight (the
/// fast path's locking read, claim mode's insert, a prune's delete, each waiting for
/// another session's lock) leaves its connection marked broken, as one dropped during
/// BEGIN does. mysql_async would hand that statement's answer to the connection's next
/// statement: the next handler took a read's `1` for its own and answered `Duplicate`
/// for a new message, or took an insert's 1062 for its marker's and acknowledged a
/// batch it never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_dropped_outside_a_transaction_leaves_its_connection_marked() {
    let Some(db) = create("dropped_outside_a_transaction").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 4).await;
        let calls = AtomicUsize::new(0);
        for (mode, new) in [("fast path", 1), ("claim", 2), ("prune", 3)] {
            let mut conn = db.connect().await;
            let old = Credit::numbered(0);
            let key = "claimed".to_owned();
            // Processed once, before the lock that makes the next call wait.
            let first = if mode == "claim" {
                record_claimed(&mut conn, &key, &calls).await
            } else {
                common::credit(&mut conn, &old).await
            };
            assert!(first.is_ok(), "{mode}: {first:?}");
            let mut holder = db.connect().await;
            holder
                .batch_execute("BEGIN; SELECT id FROM inbox FOR UPDATE")
                .await
                .unwrap();
            let waited = if mode == "claim" {
                let redelivery = record_claimed(&mut conn, &key, &calls);
                tokio::time::timeout(Duration::from_millis(300), redelivery)
                    .await
                    .is_err()
            } else if mode == "prune" {
                let prune = diesel_inbox::prune(&mut conn, Duration::ZERO);
                tokio::time::timeout(Duration::from_millis(300), prune)
                    .await
                    .is_err()
            } else {
                let redelivery = common::credit_reading_first(&mut conn, &old);
                tokio::time::timeout(Duration::from_millis(300), redelivery)
                    .await
                    .is_err()
            };
            assert!(waited, "{mode}: the call waits for the holder's lock");
            holder.batch_execute("COMMIT").await.unwrap();
            // The dropped statement's answer reaches the connection.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let new = Credit::numbered(new);
            let next = common::batch::batch_credit(&mut conn, std::slice::from_ref(&new)).await;
            let error = next.expect_err("the connection is marked broken");
            // Refused before anything is sent, not failed on a reply out of order.
            assert!(
                matches!(error, Error::BrokenTransactionManager),
                "{mode}: {error}"
            );
            assert_eq!(classify(&error), ErrorClass::ConnectionUnusable, "{mode}");
            let next = common::credit_reading_first(&mut conn, &new).await;
            let error = next.expect_err("the connection is marked broken");
            // Refused before anything is sent, not failed on a reply out of order.
            assert!(
                matches!(error, Error::BrokenTransactionManager),
                "{mode}: {error}"
            );
            assert_eq!(classify(&error), ErrorClass::ConnectionUnusable, "{mode}");
            let fresh = common::credit(&mut db.connect().await, &new).await;
            assert_eq!(fresh, Ok(Outcome::Processed(())), "{mode}");
        }
        assert_eq!(common::balances(&db, 4).await, vec![1, 1, 1, 1]);
        assert_eq!(calls.into_inner(), 1);
    })
    .await;
    db.cleanup().await;
}

/// With autocommit off, the fast path's locking read opens a transaction of the
/// session's: it is committed, so that the read's shared lock on the marker does not
/// outlive the call and hold up a prune (or an upgrade) for as long as the connection
/// idles in its pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fast_path_read_with_autocommit_off_holds_no_lock_after_it() {
    let Some(db) = create("fast_path_autocommit_off").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut conn = common::connect_with(&db, "SET autocommit = 0").await;
        let credit = Credit::numbered(0);
        assert_eq!(
            common::credit(&mut conn, &credit).await,
            Ok(Outcome::Processed(()))
        );
        let again = common::credit_reading_first(&mut conn, &credit).await;
        assert_eq!(again, Ok(Outcome::Duplicate));
        let mut pruner = common::connect_with(&db, "SET innodb_lock_wait_timeout = 1").await;
        let pruned = diesel_inbox::prune(&mut pruner, Duration::ZERO).await;
        assert_eq!(
            pruned,
            Ok(1),
            "the marker is not locked by the idle session"
        );
    })
    .await;
    db.cleanup().await;
}

/// The relay's calls each run in a transaction of their own. One dropped midway leaves
/// that transaction open on the connection: the next call refuses the connection rather
/// than open a savepoint inside it, where it read the dropped call's answers for its own
/// (an empty take while messages were due) or panicked in diesel-async's transaction
/// manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_call_dropped_midway_leaves_its_connection_refused() {
    let Some(db) = create("relay_call_dropped").await else {
        return;
    };
    bounded(async {
        let mut setup = db.connect().await;
        diesel_inbox::outbox::migrate(&mut setup)
            .await
            .expect("migrate the outbox");
        let lease = Duration::from_secs(30);
        let mut left_open = 0;
        for pendings in 1..10 {
            let message = diesel_inbox::outbox::OutboxMessage::new("d", b"payload".to_vec());
            diesel_inbox::outbox::enqueue(&mut setup, message)
                .await
                .expect("enqueue");
            let mut conn = db.connect().await;
            let take = diesel_inbox::outbox::take(&mut conn, lease, 10);
            if common::drop_after(pendings, take).await.is_some() {
                break;
            }
            let depth =
                <diesel_async::AnsiTransactionManager as diesel_async::TransactionManager<
                    AsyncMysqlConnection,
                >>::transaction_manager_status_mut(&mut conn)
                .transaction_depth();
            if !matches!(depth, Ok(Some(_))) {
                continue;
            }
            left_open += 1;
            let next = diesel_inbox::outbox::take(&mut conn, lease, 10).await;
            let error = next
                .map(|taken| taken.len())
                .expect_err("the connection is refused");
            assert_eq!(
                classify(&error),
                ErrorClass::ConnectionUnusable,
                "after {pendings} pendings: {error}"
            );
        }
        assert!(left_open > 0, "some drop left the call's transaction open");
    })
    .await;
    db.cleanup().await;
}

/// Enqueues its message under `key`, from a handler's transaction.
#[idempotent(consumer = "outbox-keyed", key = message_id)]
async fn announce_keyed(
    conn: &mut AsyncMysqlConnection,
    message_id: &str,
    key: &str,
) -> Result<(), Error> {
    let message = diesel_inbox::outbox::OutboxMessage::new("d", message_id.as_bytes().to_vec())
        .ordering_key(key);
    diesel_inbox::outbox::enqueue(conn, message).await?;
    Ok(())
}

/// Handlers that enqueue under different ordering keys do not wait for each other, as
/// the outbox guide promises: each locks its key's row alone. The key's unsent messages
/// were read with a locking read, whose next-key locks on the outbox's index made
/// enqueues under other keys deadlock (7 to 17 of these 300 calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handlers_enqueuing_under_different_keys_never_deadlock() {
    let Some(db) = create("outbox_keys_apart").await else {
        return;
    };
    bounded(async {
        let mut setup = db.connect().await;
        diesel_inbox::outbox::migrate(&mut setup)
            .await
            .expect("migrate the outbox");
        const KEYS: usize = 5;
        const MESSAGES: usize = 60;
        let writers = (0..KEYS).map(|key| {
            let db = db.clone();
            tokio::spawn(async move {
                let mut conn = db.connect().await;
                let mut failures = Vec::new();
                for n in 0..MESSAGES {
                    let id = format!("key-{key}-{n}");
                    let announced = announce_keyed(&mut conn, &id, &format!("key-{key}")).await;
                    if let Err(error) = announced {
                        failures.push(error.to_string());
                    }
                }
                failures
            })
        });
        let failures: Vec<String> = futures_util::future::join_all(writers)
            .await
            .into_iter()
            .flat_map(|failures| failures.expect("a writer"))
            .collect();
        assert_eq!(failures, Vec::<String>::new());
        let in_order = "SELECT COUNT(*) FROM inbox_outbox \
             WHERE ordering_seq = CAST(SUBSTRING_INDEX(payload, '-', -1) AS SIGNED) + 1";
        let numbered = select_i64(&mut setup, in_order).await.unwrap();
        assert_eq!(
            numbered,
            (KEYS * MESSAGES) as i64,
            "each key's messages in order"
        );
    })
    .await;
    db.cleanup().await;
}

/// Counts its calls, in claim mode.
#[idempotent(consumer = "charset-claim", key = key, claim)]
async fn record_claimed(
    conn: &mut AsyncMysqlConnection,
    key: &str,
    calls: &AtomicUsize,
) -> Result<(), Error> {
    let _ = conn;
    calls.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// A claim-mode handler whose connection's character set differs from its client's:
/// the server converts text parameters from the one to the other, so the claim's
/// statements send keys as bytes. Each claim completes, and a redelivery on that
/// session or another is a duplicate. (The key property tests cover the other forms.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_complete_whatever_the_connection_character_set() {
    let Some(db) = create("claim_connection_charset").await else {
        return;
    };
    bounded(async {
        let calls = AtomicUsize::new(0);
        let sessions = [
            "SET character_set_connection = latin1",
            "SET collation_connection = utf8mb3_general_ci",
            "SET character_set_client = latin1",
            "SET character_set_connection = utf16",
        ];
        for (n, settings) in sessions.into_iter().enumerate() {
            let key = format!("claim-{n}-é-日本-😀");
            let mut conn = common::connect_with(&db, settings).await;
            let first = record_claimed(&mut conn, &key, &calls).await;
            assert_eq!(first, Ok(Outcome::Processed(())), "{settings}");
            let again = record_claimed(&mut conn, &key, &calls).await;
            assert_eq!(again, Ok(Outcome::Duplicate), "{settings}");
            let elsewhere = record_claimed(&mut db.connect().await, &key, &calls).await;
            assert_eq!(elsewhere, Ok(Outcome::Duplicate), "{settings}");
        }
        assert_eq!(calls.into_inner(), sessions.len());
    })
    .await;
    db.cleanup().await;
}

/// MariaDB's snapshot isolation (`innodb_snapshot_isolation`, on by default from 11.6)
/// refuses a body's write to a row that another transaction changed after the body read
/// it. That conflict is retried, never dead-lettered, in any server language.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_conflicts_are_retried() {
    let Some(db) = create("snapshot_conflicts").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut writer = db.connect().await;
        if !has_snapshot_isolation(&mut writer).await {
            return;
        }
        for language in ["en_US", "de_DE", "ja_JP", "et_EE"] {
            let settings = format!("SET lc_messages = '{language}'; {SNAPSHOT_ISOLATION}");
            let mut body = common::connect_with(&db, &settings).await;
            body.batch_execute("START TRANSACTION; SELECT balance FROM accounts WHERE id = 0")
                .await
                .unwrap();
            writer
                .batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 0")
                .await
                .unwrap();
            let error = body
                .batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 0")
                .await
                .expect_err("a snapshot conflict");
            assert_eq!(
                classify(&error),
                ErrorClass::Transient,
                "{language}: {error}"
            );
            body.batch_execute("ROLLBACK").await.unwrap();
        }
    })
    .await;
    db.cleanup().await;
}

/// A handler whose body writes into the table that `a_full_table_is_retried` fills.
#[idempotent(consumer = "fill", key = key)]
async fn fill(conn: &mut AsyncMysqlConnection, key: &str) -> Result<(), Error> {
    conn.batch_execute("INSERT INTO filler (pad) VALUES (REPEAT('x', 1000))")
        .await
}

/// A full table in a handler's body (InnoDB's answer to a full disk; here a MEMORY table
/// at its `max_heap_table_size`) is retried in every way a handler's code carries it, in
/// each server language, never dead-lettered; once there is room, the message applies
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_table_is_retried() {
    let Some(db) = create("full_table").await else {
        return;
    };
    bounded(async {
        let mut admin = db.connect().await;
        admin
            .batch_execute(
                "SET SESSION max_heap_table_size = 16384; \
                 CREATE TABLE filler (pad VARCHAR(1000)) ENGINE = MEMORY",
            )
            .await
            .unwrap();
        let mut rows = 0;
        while admin
            .batch_execute("INSERT INTO filler (pad) VALUES (REPEAT('x', 1000))")
            .await
            .is_ok()
        {
            rows += 1;
            assert!(rows < 1000, "16 KiB holds no 1 MB");
        }
        for language in ["en_US", "de_DE", "ja_JP", "ko_KR", "uk_UA"] {
            let mut conn =
                common::connect_with(&db, &format!("SET lc_messages = '{language}'")).await;
            let full = fill(&mut conn, "m-1").await.expect_err("the table is full");
            assert_eq!(classify(&full), ErrorClass::Transient, "{language}: {full}");
            common::verdicts::assert_retried_in_every_shape(&full).await;
        }
        admin.batch_execute("DELETE FROM filler").await.unwrap();
        let mut conn = db.connect().await;
        assert_eq!(fill(&mut conn, "m-1").await, Ok(Outcome::Processed(())));
        assert_eq!(fill(&mut conn, "m-1").await, Ok(Outcome::Duplicate));
        let stored = select_i64(&mut admin, "SELECT COUNT(*) AS value FROM filler").await;
        assert_eq!(stored.unwrap(), 1);
    })
    .await;
    db.cleanup().await;
}

/// With the server speaking German, a duplicate is still a duplicate (in sequence and
/// for a copy that waited), and a lock wait timeout is still worth a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn localized_server_messages_are_recognised() {
    let Some(db) = create("localized_messages").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 2).await;
        let german = "SET lc_messages = 'de_DE'";
        let conn_b = common::connect_with(&db, german).await;
        let (_, second) = common::overlap(&db, conn_b, 0, true, false).await;
        assert_eq!(second.unwrap(), Outcome::Duplicate);
        let mut conn = common::connect_with(&db, german).await;
        assert_eq!(
            common::credit(&mut conn, &Credit::numbered(0))
                .await
                .unwrap(),
            Outcome::Duplicate
        );
        let insert = "INSERT INTO inbox (message_id, consumer) VALUES ('msg-0', 'credit')";
        let raw = conn.batch_execute(insert).await.expect_err("duplicate");
        assert!(raw.to_string().starts_with("Doppelter Eintrag"), "{raw}");
        assert_eq!(classify(&raw), ErrorClass::InboxDuplicate);

        for language in ["de_DE", "fr_FR", "es_ES", "ja_JP"] {
            let settings =
                format!("SET lc_messages = '{language}'; SET innodb_lock_wait_timeout = 1");
            let conn_b = common::connect_with(&db, &settings).await;
            let error = common::wait_cut_short(&db, conn_b, 1, false)
                .await
                .expect_err("the lock wait timed out");
            assert_eq!(
                classify(&error),
                ErrorClass::Transient,
                "{language}: {error}"
            );
        }
        // Redelivered, the message whose waits timed out applies once.
        assert_eq!(
            common::credit(&mut conn, &Credit::numbered(1))
                .await
                .unwrap(),
            Outcome::Processed(())
        );
        assert_eq!(common::balances(&db, 2).await, vec![1, 1]);
    })
    .await;
    db.cleanup().await;
}

/// Waiting for another delivery's marker is designed behaviour; a statement timeout or
/// an operator's `KILL QUERY` that cuts it short is worth a retry, never a dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interrupted_waits_are_transient() {
    let Some(db) = create("interrupted_waits").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 2).await;
        for read_first in [false, true] {
            let conn_b = common::connect_with(&db, "SET max_statement_time = 0.5").await;
            let error = common::wait_cut_short(&db, conn_b, 0, read_first)
                .await
                .expect_err("the statement timed out");
            assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
        }

        let mut conn_b = db.connect().await;
        let id = MysqlDb::connection_id(&mut conn_b).await;
        let killer = tokio::spawn({
            let db = db.clone();
            async move {
                wait_for_lock_waiters(&db, 1).await;
                let mut admin = db.connect().await;
                admin
                    .batch_execute(&format!("KILL QUERY {id}"))
                    .await
                    .unwrap();
            }
        });
        let gate = Gate::held(false);
        let mut conn_a = db.connect().await;
        let first = tokio::spawn({
            let gate = Arc::clone(&gate);
            async move { common::gated_credit(&mut conn_a, &Credit::numbered(1), &gate).await }
        });
        gate.entered.notified().await;
        let error = common::credit(&mut conn_b, &Credit::numbered(1))
            .await
            .expect_err("killed");
        assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
        killer.await.unwrap();
        gate.release.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), Outcome::Processed(()));
        assert_eq!(
            common::credit(&mut conn_b, &Credit::numbered(1))
                .await
                .unwrap(),
            Outcome::Duplicate
        );
        // The message whose waits timed out, redelivered, applies once.
        assert_eq!(
            common::credit(&mut conn_b, &Credit::numbered(0))
                .await
                .unwrap(),
            Outcome::Processed(())
        );
        assert_eq!(common::balances(&db, 2).await, vec![1, 1]);
    })
    .await;
    db.cleanup().await;
}

/// Three instances race on one key while the first rolls back: InnoDB can deadlock the
/// two waiters (1213). The loser's error is transient, and redelivering it still gives
/// exactly one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_way_deadlock_is_transient_and_retry_is_exactly_once() {
    let Some(db) = create("three_way_deadlock").await else {
        return;
    };
    bounded(async {
        let attempts = 10;
        common::create_tables(&db, attempts).await;
        let mut deadlocks = 0;
        for n in 0..attempts {
            let message = Credit::numbered(n);
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
            wait_for_lock_waiters(&db, 2).await;
            gate.release.notify_one();
            assert!(matches!(
                first.await.unwrap(),
                Err(Error::RollbackTransaction)
            ));

            let mut processed = 0;
            for waiter in waiters {
                let (mut conn, mut result) = waiter.await.unwrap();
                let mut redeliveries = 0;
                while let Err(error) = &result {
                    assert!(
                        error.to_string().starts_with("Deadlock found"),
                        "only a deadlock (1213) is expected here: {error}"
                    );
                    assert_eq!(classify(error), ErrorClass::Transient, "{error}");
                    deadlocks += 1;
                    redeliveries += 1;
                    assert!(redeliveries < common::MAX_REDELIVERIES, "{error}");
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
    })
    .await;
    db.cleanup().await;
}

/// The three-way deadlock again, each waiter delivering through the retry helper: the
/// deadlock never reaches the caller, and the message is applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_way_deadlock_through_the_retry_helper_is_exactly_once() {
    let Some(db) = create("retried_deadlock").await else {
        return;
    };
    bounded(async {
        let attempts = 10;
        common::create_tables(&db, attempts).await;
        let retried = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for n in 0..attempts {
            let message = Credit::numbered(n);
            let gate = Gate::held(true);
            let mut first_conn = db.connect().await;
            let first = tokio::spawn({
                let (gate, message) = (gate.clone(), message.clone());
                async move { common::gated_credit(&mut first_conn, &message, &gate).await }
            });
            gate.entered.notified().await;
            let waiters: Vec<_> = (0..2)
                .map(|_| {
                    let (db, message, retried) = (db.clone(), message.clone(), retried.clone());
                    tokio::spawn(async move {
                        let policy = diesel_inbox::RetryPolicy::new().with_max_retries(10);
                        let mut runs = 0;
                        let outcome = diesel_inbox::retry(&policy, || {
                            runs += 1;
                            let (db, message) = (db.clone(), message.clone());
                            async move {
                                let mut conn = db.connect().await;
                                common::credit(&mut conn, &message).await
                            }
                        })
                        .await;
                        retried.fetch_add(runs - 1, std::sync::atomic::Ordering::Relaxed);
                        outcome
                    })
                })
                .collect();
            wait_for_lock_waiters(&db, 2).await;
            gate.release.notify_one();
            assert!(matches!(
                first.await.unwrap(),
                Err(Error::RollbackTransaction)
            ));
            let mut processed = 0;
            for waiter in waiters {
                let outcome = waiter.await.unwrap().expect("no error reaches the caller");
                processed += usize::from(outcome == Outcome::Processed(()));
            }
            assert_eq!(processed, 1, "attempt {n}");
        }
        assert!(
            std::sync::atomic::AtomicUsize::load(&retried, std::sync::atomic::Ordering::Relaxed)
                > 0,
            "no delivery deadlocked: the scenario did not reproduce"
        );
        assert_eq!(
            common::balances(&db, attempts).await,
            vec![1; attempts as usize]
        );
    })
    .await;
    db.cleanup().await;
}

/// Credits account 0, then fails.
#[idempotent(consumer = "failing", key = credit.message_id.as_str())]
async fn credit_then_fail(conn: &mut AsyncMysqlConnection, credit: &Credit) -> Result<(), Error> {
    common::apply(conn, credit).await?;
    Err(Error::RollbackTransaction)
}

/// Every way a call ends leaves the session's autocommit as the call found it, on or
/// off: processed, duplicate, failed, a batch, a batch of duplicates, and a call whose
/// connection lost the statement it runs after the COMMIT (as a session reset drops it),
/// which prepares it again. Each processed call is committed, also for a session with
/// autocommit off.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_call_leaves_autocommit_as_it_found_it() {
    let Some(db) = create("autocommit_restored").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut credited = 0;
        for autocommit in [1, 0] {
            let mut conn =
                common::connect_with(&db, &format!("SET autocommit = {autocommit}")).await;
            let message = |n: &str| Credit {
                message_id: format!("{autocommit}-{n}"),
                account: 0,
                amount: 1,
            };
            let assert_session = async |conn: &mut AsyncMysqlConnection, after: &str| {
                let found = select_i64(conn, "SELECT @@autocommit").await.unwrap();
                assert_eq!(found, autocommit, "after {after}");
            };
            let processed = common::credit(&mut conn, &message("a")).await.unwrap();
            assert_eq!(processed, Outcome::Processed(()));
            assert_session(&mut conn, "a processed call").await;
            let duplicate = common::credit(&mut conn, &message("a")).await.unwrap();
            assert_eq!(duplicate, Outcome::Duplicate);
            assert_session(&mut conn, "a duplicate").await;
            credit_then_fail(&mut conn, &message("b"))
                .await
                .expect_err("the body fails");
            assert_session(&mut conn, "a failed call").await;
            let batch = [message("c"), message("d")];
            let outcome = common::batch::batch_credit(&mut conn, &batch)
                .await
                .unwrap();
            assert_eq!(outcome.processed(), 2);
            assert_session(&mut conn, "a batch").await;
            let outcome = common::batch::batch_credit(&mut conn, &batch)
                .await
                .unwrap();
            assert_eq!(outcome.duplicates(), 2);
            assert_session(&mut conn, "a batch of duplicates").await;
            conn.batch_execute("DEALLOCATE PREPARE `diesel_inbox.after_commit`")
                .await
                .expect("prepared by the first commit");
            let processed = common::credit(&mut conn, &message("e")).await.unwrap();
            assert_eq!(processed, Outcome::Processed(()));
            assert_session(&mut conn, "preparing again").await;
            credited += 4;
            assert_eq!(common::balances(&db, 1).await, vec![credited]);
        }
    })
    .await;
    db.cleanup().await;
}

#[idempotent(consumer = "mysql-claimed", key = credit.message_id.as_str(), claim)]
async fn claimed(conn: &mut AsyncMysqlConnection, credit: &Credit) -> Result<(), Error> {
    common::apply(conn, credit).await
}

/// The user variables and prepared statement names a session may hold already, the
/// names this crate used before among them: each call leaves them as the session had
/// them. A prepared `diesel_inbox_after_commit` ran in place of the crate's statement
/// after every COMMIT, so autocommit stayed off where the session had it on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sessions_own_variables_and_statements_are_left_alone() {
    let Some(db) = create("own_session_state").await else {
        return;
    };
    const VARIABLES: [&str; 5] = [
        "@diesel_inbox_marker_id",
        "@diesel_inbox_database",
        "@diesel_inbox_autocommit",
        "@diesel_inbox_after_commit",
        "@diesel_inbox_claim_autocommit",
    ];
    bounded(async {
        common::create_tables(&db, 1).await;
        for autocommit in [1, 0] {
            let mut conn = db.connect().await;
            let set_variables = VARIABLES
                .iter()
                .enumerate()
                .map(|(n, variable)| format!("{variable} = {}", 1000 + n))
                .collect::<Vec<_>>()
                .join(", ");
            conn.batch_execute(&format!(
                "SET autocommit = {autocommit}, {set_variables}; \
                 PREPARE diesel_inbox_after_commit FROM 'SET @mine = @mine + 1'"
            ))
            .await
            .expect("the session's own state");
            let message = |n: &str| Credit {
                message_id: format!("{autocommit}-{n}"),
                account: 0,
                amount: 1,
            };
            let processed = common::credit(&mut conn, &message("a")).await.unwrap();
            assert_eq!(processed, Outcome::Processed(()));
            let duplicate = common::credit(&mut conn, &message("a")).await.unwrap();
            assert_eq!(duplicate, Outcome::Duplicate);
            credit_then_fail(&mut conn, &message("b"))
                .await
                .expect_err("the body fails");
            let batch = [message("c"), message("d")];
            let outcome = common::batch::batch_credit(&mut conn, &batch)
                .await
                .unwrap();
            assert_eq!(outcome.processed(), 2);
            let claimed = claimed(&mut conn, &message("e")).await.unwrap();
            assert_eq!(claimed, Outcome::Processed(()));

            let found = select_i64(&mut conn, "SELECT @@autocommit").await.unwrap();
            assert_eq!(found, autocommit, "autocommit");
            for (n, variable) in VARIABLES.iter().enumerate() {
                let found = select_i64(&mut conn, &format!("SELECT {variable}")).await;
                assert_eq!(found.unwrap(), 1000 + n as i64, "{variable}");
            }
            conn.batch_execute("SET @mine = 41; EXECUTE diesel_inbox_after_commit")
                .await
                .expect("the session's statement is still prepared");
            let mine = select_i64(&mut conn, "SELECT @mine").await.unwrap();
            assert_eq!(mine, 42, "and is still the session's own");
        }
    })
    .await;
    db.cleanup().await;
}

/// Every path works in each SQL mode a session can have. Under MariaDB's
/// `sql_mode = ORACLE`, `BEGIN` opens a PL/SQL block: every call was a syntax error,
/// `Permanent`, and every message was dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_sql_mode_is_served() {
    let Some(db) = create("sql_modes").await else {
        return;
    };
    let modes = [
        "ORACLE",
        "ANSI",
        "TRADITIONAL,NO_BACKSLASH_ESCAPES",
        "MSSQL",
        "DB2",
        "POSTGRESQL",
        "MAXDB",
        "EMPTY_STRING_IS_NULL,SIMULTANEOUS_ASSIGNMENT,PAD_CHAR_TO_FULL_LENGTH",
    ]
    .map(|mode| format!("SET SESSION sql_mode = '{mode}'"));
    bounded(every_path_is_served(&db, &modes)).await;
    db.cleanup().await;
}

/// Every path works in a session whose `SELECT`s return at most `sql_select_limit` rows,
/// or with `sql_safe_updates` (clients' safety nets, as database tools set them). At a
/// limit of 0 each of the crate's reads found no row: `migrate` failed, and a message
/// read first was dead-lettered (`NotFound`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_client_safety_net_is_served() {
    let Some(db) = create("select_limits").await else {
        return;
    };
    let limits = [
        "SET SESSION sql_select_limit = 0".to_owned(),
        "SET SESSION sql_select_limit = 1".to_owned(),
        "SET SESSION sql_safe_updates = 1".to_owned(),
    ];
    bounded(every_path_is_served(&db, &limits)).await;
    db.cleanup().await;
}

/// Each path of the crate, in a session of each of `sessions`' settings: a handler, read
/// first or not, a batch, a claim, their duplicates, `prune` and `list_stale`.
async fn every_path_is_served(db: &MysqlDb, sessions: &[String]) {
    common::create_tables(db, 4 * sessions.len() as i64).await;
    for (n, settings) in sessions.iter().enumerate() {
        let mut conn = common::connect_with(db, settings).await;
        diesel_inbox::migrate(&mut conn)
            .await
            .unwrap_or_else(|error| panic!("{settings}: {error}"));
        let [single, batch_1, batch_2, claim] =
            [0, 1, 2, 3].map(|i| Credit::numbered(4 * n as i64 + i));
        assert_eq!(
            common::credit_reading_first(&mut conn, &single).await,
            Ok(Outcome::Processed(())),
            "{settings}"
        );
        assert_eq!(
            common::credit_reading_first(&mut conn, &single).await,
            Ok(Outcome::Duplicate),
            "{settings}"
        );
        assert_eq!(
            common::credit(&mut conn, &single).await,
            Ok(Outcome::Duplicate),
            "{settings}"
        );
        let batch = [batch_1.clone(), batch_2.clone()];
        for processed in [2, 0] {
            let outcome = common::batch::batch_credit(&mut conn, &batch)
                .await
                .unwrap_or_else(|error| panic!("{settings}: {error}"));
            assert_eq!(outcome.processed(), processed, "{settings}");
        }
        assert_eq!(
            claimed(&mut conn, &claim).await,
            Ok(Outcome::Processed(())),
            "{settings}"
        );
        assert_eq!(
            claimed(&mut conn, &claim).await,
            Ok(Outcome::Duplicate),
            "{settings}"
        );
        diesel_inbox::claims::list_stale(&mut conn)
            .await
            .unwrap_or_else(|error| panic!("{settings}: {error}"));
        // A window of nothing prunes every marker of the session's four.
        let pruned = diesel_inbox::prune(&mut conn, Duration::ZERO)
            .await
            .unwrap_or_else(|error| panic!("{settings}: {error}"));
        assert_eq!(pruned, 4, "{settings}");
    }
    let balances = common::balances(db, 4 * sessions.len() as i64).await;
    assert!(balances.iter().all(|&balance| balance == 1), "{balances:?}");
}

/// A claim-mode handler whose body says it `entered`, then waits for `release`.
#[idempotent(consumer = "zoned-claim", key = key, claim, lease = Duration::from_secs(60))]
async fn held_claim(
    conn: &mut AsyncMysqlConnection,
    key: &str,
    entered: &Notify,
    release: &Notify,
) -> Result<(), Error> {
    let _ = conn;
    entered.notify_one();
    release.notified().await;
    Ok(())
}

/// `DATETIME` holds no zone: leases and markers are stamped and judged in UTC, so that
/// sessions in other time zones agree. A claim's lease written at `+00:00` is still
/// running for a redelivery at `+13:00` (which took it over while its body ran), and a
/// marker stamped at `-10:00` is inside a pruner's window at `+13:00` (which deleted it,
/// and its redelivery was processed again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_and_pruning_agree_across_session_time_zones() {
    let Some(db) = create("session_time_zones").await else {
        return;
    };
    bounded(async {
        let (entered, release) = (Notify::new(), Notify::new());
        let mut holder = common::connect_with(&db, "SET time_zone = '+00:00'").await;
        let mut elsewhere = common::connect_with(&db, "SET time_zone = '+13:00'").await;
        let holding = held_claim(&mut holder, "m-1", &entered, &release);
        // The redelivery's body, should it run, runs through.
        let (redelivered, unheld) = (Notify::new(), Notify::new());
        unheld.notify_one();
        let (first, again) = tokio::join!(holding, async {
            entered.notified().await;
            let again = held_claim(&mut elsewhere, "m-1", &redelivered, &unheld).await;
            release.notify_one();
            again
        });
        assert_eq!(first, Ok(Outcome::Processed(())));
        assert!(
            matches!(again, Ok(Outcome::InProgress { .. })),
            "a redelivery in another time zone while the body runs: {again:?}"
        );

        common::create_tables(&db, 1).await;
        let mut west = common::connect_with(&db, "SET time_zone = '-10:00'").await;
        let credit = Credit::numbered(0);
        assert_eq!(
            common::credit(&mut west, &credit).await,
            Ok(Outcome::Processed(()))
        );
        let mut east = common::connect_with(&db, "SET time_zone = '+13:00'").await;
        let pruned = diesel_inbox::prune(&mut east, Duration::from_secs(3600)).await;
        assert_eq!(
            pruned,
            Ok(0),
            "a marker a moment old is inside an hour's window"
        );
        assert_eq!(
            common::credit(&mut east, &credit).await,
            Ok(Outcome::Duplicate)
        );
    })
    .await;
    db.cleanup().await;
}

/// `migrate` on an inbox and outbox that have it all sends no DDL, so a user that may
/// only read and write rows calls it at start-up: `CREATE TABLE IF NOT EXISTS` needs
/// the right to create even where the table is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_with_nothing_to_do_needs_no_ddl_rights() {
    let Some(db) = create("migrate_rows_only").await else {
        return;
    };
    bounded(async {
        let mut conn = db.connect().await;
        diesel_inbox::outbox::migrate(&mut conn)
            .await
            .expect("the outbox");
        let user = format!("{}_rows", db.0.name());
        let database = db.0.name();
        conn.batch_execute(&format!(
            "DROP USER IF EXISTS '{user}'@'%', '{user}'@'localhost'; \
             CREATE USER '{user}'@'%', '{user}'@'localhost'; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON `{database}`.* TO '{user}'@'%', '{user}'@'localhost'"
        ))
        .await
        .expect("a user that may only read and write rows");
        let url = db.0.url();
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let (_, server) = rest.split_once('@').expect("a user in the URL");
        let as_user = format!("{scheme}://{user}@{server}");
        let mut rows_only = AsyncMysqlConnection::establish(&as_user)
            .await
            .expect("connect as the user");
        let inbox = diesel_inbox::migrate(&mut rows_only).await;
        let outbox = diesel_inbox::outbox::migrate(&mut rows_only).await;
        drop(rows_only);
        conn.batch_execute(&format!("DROP USER '{user}'@'%', '{user}'@'localhost'"))
            .await
            .expect("drop the user");
        assert_eq!(inbox, Ok(()));
        assert_eq!(outbox, Ok(()));
    })
    .await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_waits_for_its_lock_a_second_at_a_time() {
    if let Some(db) = create("migrate_lock_waits").await {
        bounded(common::migrate_waits_for_its_lock_a_second_at_a_time(
            db.clone(),
        ))
        .await;
        db.cleanup().await;
    }
}

/// `migrate`, `outbox::migrate` and `upgrade_unique_index` refuse a connection inside a
/// transaction, a test transaction's included: MySQL commits the open transaction
/// before each schema change, so a test's writes ended unseen, with `Ok`, and the
/// handlers after it committed their markers for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_changes_refuse_a_connection_in_a_transaction() {
    let Some(db) = create("schema_changes_in_a_transaction").await else {
        return;
    };
    bounded(async {
        let mut conn = db.connect().await;
        conn.begin_test_transaction()
            .await
            .expect("a test transaction");
        assert_eq!(
            diesel_inbox::migrate(&mut conn).await,
            Err(Error::AlreadyInTransaction)
        );
        assert_eq!(
            diesel_inbox::outbox::migrate(&mut conn).await,
            Err(Error::AlreadyInTransaction)
        );
        assert_eq!(
            diesel_inbox::upgrade_unique_index(&mut conn).await,
            Err(Error::AlreadyInTransaction)
        );
    })
    .await;
    db.cleanup().await;
}
lost_connection_scenario!(
    create,
    own_id = "SELECT CAST(CONNECTION_ID() AS SIGNED)",
    kill = "KILL {id}",
);

/// A pruner whose session has autocommit off (a server's default, an `init_connect`):
/// each batch's DELETE opened a transaction that nothing committed. `prune` returned the
/// count, nothing was deleted, and its locks, held while the connection idled, stopped
/// every handler's marker insert.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prune_with_autocommit_off_commits() {
    let Some(db) = create("prune_autocommit_off").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut conn = db.connect().await;
        conn.batch_execute(
            "INSERT INTO inbox (message_id, consumer, processed_at) VALUES \
             ('old-1', 'c', UTC_TIMESTAMP(6) - INTERVAL 2 DAY), \
             ('old-2', 'c', UTC_TIMESTAMP(6) - INTERVAL 2 DAY)",
        )
        .await
        .expect("old markers");
        let mut pruner = db.connect().await;
        pruner
            .batch_execute("SET autocommit = 0")
            .await
            .expect("autocommit off");
        let pruned = diesel_inbox::prune(&mut pruner, Duration::from_secs(3600)).await;
        assert_eq!(pruned, Ok(2));
        let left = select_i64(&mut conn, "SELECT COUNT(*) FROM inbox").await;
        assert_eq!(left, Ok(0), "the deletes are committed");
        // A handler's marker goes in while the pruner's connection idles.
        conn.batch_execute("SET innodb_lock_wait_timeout = 2")
            .await
            .expect("a short wait");
        let credited = common::credit(&mut conn, &Credit::numbered(0)).await;
        assert_eq!(credited, Ok(Outcome::Processed(())));
        drop(pruner);
    })
    .await;
    db.cleanup().await;
}

/// A body that records an entry unless it is there already, by trying and handling the
/// duplicate key, as MySQL code often does, then credits.
#[idempotent(consumer = "recording_once", key = credit.message_id.as_str())]
async fn credit_recording_once(
    conn: &mut AsyncMysqlConnection,
    credit: &Credit,
) -> Result<(), Error> {
    match conn
        .batch_execute("INSERT INTO ledger (entry) VALUES ('once')")
        .await
    {
        Ok(())
        | Err(Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, _)) => {}
        Err(error) => return Err(error),
    }
    common::apply(conn, credit).await
}

/// A session with `unique_checks` and `foreign_key_checks` off (as a dump's restore
/// leaves it): MariaDB buffers the first inserts into an empty table in bulk, and the
/// body's failed statement undid the buffered marker while the transaction went on. The
/// body committed without its marker, and every redelivery was processed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_without_unique_checks_keeps_its_marker() {
    let Some(db) = create("without_unique_checks").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut conn = db.connect().await;
        conn.batch_execute(
            "INSERT INTO ledger (entry) VALUES ('once'); \
             SET unique_checks = 0, foreign_key_checks = 0",
        )
        .await
        .expect("a bulk-loading session");
        for delivery in 0..3 {
            let outcome = credit_recording_once(&mut conn, &Credit::numbered(0)).await;
            let expected = if delivery == 0 {
                Outcome::Processed(())
            } else {
                Outcome::Duplicate
            };
            assert_eq!(outcome, Ok(expected), "delivery {delivery}");
        }
        assert_eq!(common::balances(&db, 1).await, vec![1]);
    })
    .await;
    db.cleanup().await;
}

/// An inbox converted to another engine than InnoDB (MyISAM, by a DBA) commits each
/// marker on its own, apart from the handler's transaction: a body that failed left its
/// marker, and its redelivery was acknowledged as a duplicate, unprocessed. `migrate`,
/// which every instance runs at start-up, refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_refuses_an_inbox_off_innodb() {
    let Some(db) = create("inbox_off_innodb").await else {
        return;
    };
    bounded(async {
        let mut conn = db.connect().await;
        conn.batch_execute("ALTER TABLE inbox ENGINE = MyISAM")
            .await
            .expect("a DBA's conversion");
        let refused = diesel_inbox::migrate(&mut conn).await;
        let error = refused.expect_err("not on InnoDB");
        assert!(error.to_string().contains("ENGINE = InnoDB"), "{error}");
        conn.batch_execute("ALTER TABLE inbox ENGINE = InnoDB")
            .await
            .expect("converted back");
        diesel_inbox::migrate(&mut conn)
            .await
            .expect("migrate on InnoDB");
    })
    .await;
    db.cleanup().await;
}
