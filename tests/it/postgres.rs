//! The PostgreSQL suite: a schema per test on the server named by `POSTGRES_URL`.

use crate::common;

use std::time::Duration;

use diesel::result::Error;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use diesel_inbox::testing::{TestDatabase, select_i64};
use diesel_inbox::{ErrorClass, Outcome, classify, idempotent};

use common::{Credit, TestDb, bounded};

#[derive(Clone)]
pub(crate) struct PgDb(pub(crate) TestDatabase<AsyncPgConnection>);

/// The test's schema, or `None` when the suite is skipped.
pub(crate) async fn create(test: &str) -> Option<PgDb> {
    let url = common::server_url("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")?;
    let db = TestDatabase::postgres(&url, test).await;
    Some(PgDb(db.expect("create the test schema")))
}

impl TestDb for PgDb {
    type Conn = AsyncPgConnection;

    fn database(&self) -> &TestDatabase<AsyncPgConnection> {
        &self.0
    }

    /// The test's connections carry its schema's name as their `application_name`.
    async fn lock_waiters(&self) -> Option<i64> {
        let mut conn = self.connect().await;
        let query = format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{}' \
             AND wait_event_type = 'Lock'",
            self.0.name()
        );
        Some(
            select_i64(&mut conn, &query)
                .await
                .expect("pg_stat_activity"),
        )
    }
}

common_scenarios!(create);
outbox_scenarios!(
    create,
    sessions = [
        "SET default_transaction_isolation = 'repeatable read'",
        "SET default_transaction_isolation = 'serializable'",
        "SET default_transaction_isolation = 'serializable'; \
         SET default_transaction_deferrable = on",
        "SET client_encoding = 'LATIN1'",
        "SET synchronous_commit = off",
        "SET idle_in_transaction_session_timeout = '2s'",
        "SET DateStyle = 'SQL, DMY'; SET TimeZone = 'Pacific/Chatham'",
    ],
);
batch_scenarios!(create, swallowed = "SELECT * FROM no_such_table");
verdict_scenarios!(
    create,
    lock_wait = "SET lock_timeout = '100ms'",
    read_only = "SET default_transaction_read_only = on",
    unreachable = AsyncPgConnection => "postgres://postgres@127.0.0.1:1/test",
);
key_scenarios!(
    create,
    common::keys::Storage {
        refuses_nul: true,
        stored_hex: "upper(encode(convert_to(message_id, 'UTF8'), 'hex'))",
        expected_hex: common::keys::utf8_hex,
    };
    keys_are_stored_as_encoded => "",
    keys_are_stored_as_encoded_in_latin1 => "SET client_encoding = 'LATIN1'",
);

#[idempotent(consumer = "swallowing", key = credit.message_id.as_str())]
async fn swallowing_credit(conn: &mut AsyncPgConnection, credit: &Credit) -> Result<(), Error> {
    conn.batch_execute(&format!(
        "UPDATE accounts SET balance = balance + 1 WHERE id = {}",
        credit.account
    ))
    .await?;
    // The handler ignores a failed statement; PostgreSQL has aborted the transaction and
    // would answer COMMIT with a silent ROLLBACK.
    let _ignored = conn.batch_execute("SELECT 1 / 0").await;
    Ok(())
}

/// `Processed` must mean committed even when the body swallows an error.
#[tokio::test]
async fn swallowed_error_is_not_reported_processed() {
    let Some(db) = create("swallowed_error").await else {
        return;
    };
    common::create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    let error = swallowing_credit(&mut conn, &Credit::numbered(0))
        .await
        .expect_err("not committed");
    assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
    assert!(error.to_string().contains("rolled back"), "{error}");
    assert_eq!(
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .unwrap(),
        0
    );
    assert_eq!(common::balances(&db, 1).await, vec![0]);
    // The transaction is over and the connection serves the redelivery.
    assert_eq!(
        common::credit(&mut conn, &Credit::numbered(0))
            .await
            .unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(common::balances(&db, 1).await, vec![1]);
    db.cleanup().await;
}

/// Inside a test transaction too: the swallowed error aborted the transaction, and the
/// handler recovers the test transaction from its savepoint rather than leave it aborted.
#[tokio::test]
async fn swallowed_error_in_a_test_transaction_is_not_reported_processed() {
    let Some(db) = create("swallowed_error_in_test").await else {
        return;
    };
    common::create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    conn.begin_test_transaction().await.unwrap();
    let error = swallowing_credit(&mut conn, &Credit::numbered(0))
        .await
        .expect_err("not committed");
    assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
    assert!(error.to_string().contains("rolled back"), "{error}");
    let markers = "SELECT COUNT(*) FROM inbox";
    assert_eq!(select_i64(&mut conn, markers).await.unwrap(), 0);
    assert_eq!(
        common::credit(&mut conn, &Credit::numbered(0))
            .await
            .unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(select_i64(&mut conn, markers).await.unwrap(), 1);
    // Its open transaction's locks would hold up the DROP SCHEMA.
    drop(conn);
    db.cleanup().await;
}

/// The server log, where PostgreSQL writes an `ERROR` line for every unique violation.
fn server_log() -> Option<String> {
    let dir = std::fs::read_dir("/var/log/postgresql").ok()?;
    let logs = dir
        .filter_map(Result::ok)
        .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "log"));
    Some(
        logs.filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
            .collect(),
    )
}

/// A server that speaks another language (`lc_messages`, which `initdb` takes from the
/// system's locale) words its errors in it. A lock time-out is still retried in every
/// way a handler's code carries it, and a body that carried on past an error still
/// learns that its transaction was rolled back underneath it. In German, French or
/// Japanese both were dead-lettered. (`.ci/run` generates the locales.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn localized_server_messages_are_recognised() {
    for language in ["de_DE", "fr_FR", "ja_JP"] {
        let Some(db) = create(&format!("localized_{}", language.to_lowercase())).await else {
            return;
        };
        let speaking = format!("SET lc_messages = '{language}.UTF-8'");
        let lock_wait = format!("{speaking}; SET lock_timeout = '100ms'");
        bounded(common::verdicts::wrapped_database_errors_are_retried(
            db.clone(),
            &lock_wait,
        ))
        .await;
        let mut conn = common::connect_with(&db, &speaking).await;
        let swallowed = Credit {
            message_id: format!("swallowed-{language}"),
            account: 0,
            amount: 1,
        };
        let error = swallowing_credit(&mut conn, &swallowed)
            .await
            .expect_err("the transaction was aborted");
        assert!(
            error
                .to_string()
                .starts_with("the handler's transaction was rolled back"),
            "{language}: {error}"
        );
        assert_eq!(classify(&error), ErrorClass::Transient, "{language}");
        db.cleanup().await;
    }
}

/// A failover in another language than English: a read-only session is retried in every
/// way a handler's code carries its error, and so is a session the server ends while its
/// statement runs, which then gets the server's own words. Where the error carried only
/// the text, both were dead-lettered in German.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_is_retried_in_every_language() {
    for language in ["de_DE", "fr_FR", "ja_JP"] {
        let Some(db) = create(&format!("failover_{}", language.to_lowercase())).await else {
            return;
        };
        let speaking = format!("SET lc_messages = '{language}.UTF-8'");
        let read_only = format!("{speaking}; SET default_transaction_read_only = on");
        bounded(common::verdicts::read_only_session_is_retried(
            db.clone(),
            &read_only,
        ))
        .await;
        let mut conn = common::connect_with(&db, &speaking).await;
        let pid = select_i64(&mut conn, "CAST(pg_backend_pid() AS bigint)")
            .await
            .unwrap();
        // Ended while a statement runs, the session gets the server's own words.
        let mut admin = db.connect().await;
        let (lost, ended) = tokio::join!(conn.batch_execute("SELECT pg_sleep(30)"), async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            admin
                .batch_execute(&format!("SELECT pg_terminate_backend({pid})"))
                .await
        });
        ended.unwrap();
        let lost = lost.expect_err("the session is gone");
        assert_eq!(
            classify(&lost),
            ErrorClass::ConnectionUnusable,
            "{language}: {lost}"
        );
        common::verdicts::assert_retried_in_every_shape(&lost).await;
        db.cleanup().await;
    }
}

/// Each of PostgreSQL's translations of what a retry gets past, as the server itself
/// words it: a statement time-out, a lock time-out, a deadlock, and a statement in a
/// transaction that an error aborted are transient in every language it speaks (where a
/// translation lacks a text, the server writes it in English). `.ci/run` generates the
/// locales.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_translation_is_recognised() {
    let Some(db) = create("every_translation").await else {
        return;
    };
    bounded(async {
        let languages = [
            "de_DE", "es_ES", "fr_FR", "it_IT", "ja_JP", "ka_GE", "ko_KR", "ru_RU", "sv_SE",
            "uk_UA", "zh_CN", "zh_TW",
        ];
        for language in languages {
            let speaking = format!("SET lc_messages = '{language}.UTF-8'");
            let mut conn = common::connect_with(&db, &speaking).await;
            let mut other = common::connect_with(&db, &speaking).await;
            let mut errors = Vec::new();

            let timed_out = conn
                .batch_execute("SET statement_timeout = '1ms'; SELECT pg_sleep(1)")
                .await
                .expect_err("a statement time-out");
            errors.push(timed_out);
            conn.batch_execute("SET statement_timeout = 0")
                .await
                .unwrap();

            conn.batch_execute("BEGIN").await.unwrap();
            conn.batch_execute("SELECT 1 / 0")
                .await
                .expect_err("division by zero");
            let aborted = conn
                .batch_execute("SELECT 1")
                .await
                .expect_err("the transaction is aborted");
            errors.push(aborted);
            conn.batch_execute("ROLLBACK").await.unwrap();

            other
                .batch_execute("SELECT pg_advisory_lock(1)")
                .await
                .unwrap();
            let lock_wait = conn
                .batch_execute("SET lock_timeout = '10ms'; SELECT pg_advisory_lock(1)")
                .await
                .expect_err("a lock time-out");
            errors.push(lock_wait);
            conn.batch_execute("SET lock_timeout = 0").await.unwrap();

            // Each waits for the lock the other holds; the first to look finds the
            // deadlock, and each lets go of its locks once its wait ends.
            conn.batch_execute("SELECT pg_advisory_lock(2)")
                .await
                .unwrap();
            let release = "SELECT pg_advisory_unlock_all()";
            let (first, second) = tokio::join!(
                async {
                    let waited = conn
                        .batch_execute("SET deadlock_timeout = '10ms'; SELECT pg_advisory_lock(1)")
                        .await;
                    conn.batch_execute(release).await.unwrap();
                    waited
                },
                async {
                    let waited = other.batch_execute("SELECT pg_advisory_lock(2)").await;
                    other.batch_execute(release).await.unwrap();
                    waited
                },
            );
            errors.push(first.and(second).expect_err("a deadlock"));

            for error in errors {
                assert_eq!(
                    classify(&error),
                    ErrorClass::Transient,
                    "{language}: {error}"
                );
            }
        }
    })
    .await;
    db.cleanup().await;
}

/// A full disk refuses the marker ("could not extend file …: No space left on device",
/// 53100): the message is retried in every way a handler's code carries the error,
/// never dead-lettered, and once there is room again it applies once. The inbox moves to
/// a tablespace on a 1 MiB tmpfs, filled up first.
///
/// Ignored, since mounting the tmpfs takes root: `.ci/run` runs it on its own
/// (`--run-ignored only`), as root.
#[tokio::test]
#[ignore = "mounts a tmpfs for a tablespace, which takes root; run with --run-ignored"]
async fn a_full_disk_is_retried() {
    const PLACE: &str = "/tmp/diesel-inbox-full-disk";
    const TABLESPACE: &str = "inbox_test_full_disk";
    let Some(db) = create("full_disk").await else {
        return;
    };
    let mut admin = db.connect().await;
    // What a run that panicked left behind.
    let _ = admin
        .batch_execute(&format!("DROP TABLESPACE IF EXISTS {TABLESPACE}"))
        .await;
    let run = |command: &str| {
        let status = std::process::Command::new("sh")
            .args(["-c", command])
            .status()
            .expect("sh");
        assert!(status.success(), "{command}");
    };
    run(&format!(
        "umount {PLACE} 2>/dev/null; mkdir -p {PLACE} && \
         mount -t tmpfs -o size=1m tmpfs {PLACE} && chown postgres:postgres {PLACE}"
    ));
    common::create_tables(&db, 1).await;
    // One statement at a time: a batch runs as one transaction, which CREATE TABLESPACE
    // refuses.
    for statement in [
        format!("CREATE TABLESPACE {TABLESPACE} LOCATION '{PLACE}'"),
        format!("ALTER TABLE inbox SET TABLESPACE {TABLESPACE}"),
        format!("CREATE TABLE filler (pad text) TABLESPACE {TABLESPACE}"),
    ] {
        admin.batch_execute(&statement).await.unwrap();
    }
    let filled = admin
        .batch_execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 10000)")
        .await
        .expect_err("1 MiB holds no 10 MB");
    assert_eq!(classify(&filled), ErrorClass::Transient, "{filled}");

    let mut conn = db.connect().await;
    let full = common::credit(&mut conn, &Credit::numbered(0))
        .await
        .expect_err("no room for the marker");
    assert!(
        full.to_string().contains("No space left on device"),
        "{full}"
    );
    common::verdicts::assert_retried_in_every_shape(&full).await;
    assert_eq!(common::balances(&db, 1).await, vec![0]);

    admin.batch_execute("DROP TABLE filler").await.unwrap();
    assert_eq!(
        common::credit(&mut conn, &Credit::numbered(0))
            .await
            .unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(common::balances(&db, 1).await, vec![1]);

    for statement in [
        "ALTER TABLE inbox SET TABLESPACE pg_default".to_owned(),
        format!("DROP TABLESPACE {TABLESPACE}"),
    ] {
        admin.batch_execute(&statement).await.unwrap();
    }
    run(&format!("umount {PLACE}"));
    db.cleanup().await;
}

/// A duplicate must not raise a unique violation, which would write an `ERROR` line to
/// the server log per duplicate. A raw duplicate insert shows that the log is read.
///
/// Ignored, so that the test count shows it skipped where the server's log cannot be
/// read: `.ci/run` runs it on its own (`--run-ignored only`), where the log must be there.
#[tokio::test]
#[ignore = "reads the PostgreSQL server log under /var/log/postgresql; run with --run-ignored"]
async fn duplicates_write_no_error_to_the_server_log() {
    let Some(db) = create("duplicates_no_error_log").await else {
        return;
    };
    assert!(
        server_log().is_some(),
        "no readable PostgreSQL server log under /var/log/postgresql"
    );
    common::create_tables(&db, 1).await;
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let message = Credit {
        message_id: format!("no-error-{run}"),
        account: 0,
        amount: 1,
    };
    let mut conn = db.connect().await;
    assert_eq!(
        slow_credit(&mut conn, &message).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        slow_credit(&mut conn, &message).await.unwrap(),
        Outcome::Duplicate
    );

    let control = format!("raw-duplicate-{run}");
    let insert = format!("INSERT INTO inbox (message_id, consumer) VALUES ('{control}', 'credit')");
    conn.batch_execute(&insert).await.unwrap();
    conn.batch_execute(&insert)
        .await
        .expect_err("raw duplicate");
    let mut log = String::new();
    for _ in 0..50 {
        log = server_log().unwrap_or_default();
        if log.contains(&control) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        log.contains(&control),
        "the raw duplicate's ERROR reached the log"
    );
    assert!(
        !log.contains(&message.message_id),
        "the handler's duplicate logged an ERROR"
    );
    db.cleanup().await;
}

/// Without the fast path, every duplicate reaches the marker insert.
#[idempotent(consumer = "no-fast-path", key = credit.message_id.as_str(), fast_path = false)]
async fn slow_credit(conn: &mut AsyncPgConnection, credit: &Credit) -> Result<(), Error> {
    conn.batch_execute(&format!(
        "UPDATE accounts SET balance = balance + 1 WHERE id = {}",
        credit.account
    ))
    .await
}

/// A real deadlock (40P01, which diesel-async reports as `Unknown`) is transient.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlock_is_transient() {
    let Some(db) = create("deadlock").await else {
        return;
    };
    common::create_tables(&db, 2).await;
    let (mut a, mut b) = (db.connect().await, db.connect().await);
    a.batch_execute("BEGIN; UPDATE accounts SET balance = 1 WHERE id = 0")
        .await
        .unwrap();
    b.batch_execute("BEGIN; UPDATE accounts SET balance = 1 WHERE id = 1")
        .await
        .unwrap();
    let a_waits = tokio::spawn(async move {
        let result = a
            .batch_execute("UPDATE accounts SET balance = 2 WHERE id = 1")
            .await;
        let _ = a.batch_execute("ROLLBACK").await;
        result
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b_result = b
        .batch_execute("UPDATE accounts SET balance = 2 WHERE id = 0")
        .await;
    let _ = b.batch_execute("ROLLBACK").await;
    let a_result = a_waits.await.unwrap();
    let error = a_result
        .err()
        .or(b_result.err())
        .expect("one side deadlocks");
    assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
    db.cleanup().await;
}

/// Handlers take pooled connections as they are.
#[tokio::test]
async fn pooled_connections_work() {
    let Some(db) = create("pooled").await else {
        return;
    };
    common::create_tables(&db, 2).await;
    let url = db.0.url().to_owned();

    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(url.clone());
    let pool = diesel_async::pooled_connection::deadpool::Pool::builder(manager)
        .build()
        .unwrap();
    let mut pooled = pool.get().await.unwrap();
    assert_eq!(
        common::credit(&mut pooled, &Credit::numbered(0))
            .await
            .unwrap(),
        Outcome::Processed(())
    );

    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(url);
    let pool = diesel_async::pooled_connection::bb8::Pool::builder()
        .build(manager)
        .await
        .unwrap();
    let mut pooled = pool.get().await.unwrap();
    assert_eq!(
        common::credit(&mut pooled, &Credit::numbered(1))
            .await
            .unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        common::credit(&mut pooled, &Credit::numbered(0))
            .await
            .unwrap(),
        Outcome::Duplicate
    );
    drop(pooled);
    assert_eq!(common::balances(&db, 2).await, vec![1, 1]);
    db.cleanup().await;
}

/// A statement timeout that cuts short the wait for another delivery's marker is worth a
/// retry, never a dead letter: the delivery being waited for may still roll back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statement_timeout_on_the_marker_wait_is_transient() {
    let Some(db) = create("statement_timeout").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        for read_first in [false, true] {
            let conn_b = common::connect_with(&db, "SET statement_timeout = '500ms'").await;
            let error = common::wait_cut_short(&db, conn_b, 0, read_first)
                .await
                .expect_err("the statement timed out");
            assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
        }
        let mut conn = db.connect().await;
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

/// At REPEATABLE READ and SERIALIZABLE, a copy that waited for another delivery's marker
/// fails with a serialization failure (40001) instead of finding the duplicate: its
/// snapshot predates that marker. Transient, and the redelivery is the duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stricter_isolation_turns_the_waiting_duplicate_into_a_retry() {
    let Some(db) = create("stricter_isolation").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 2).await;
        for (n, level) in [(0, "repeatable read"), (1, "serializable")] {
            let settings = format!("SET default_transaction_isolation = '{level}'");
            let conn_b = common::connect_with(&db, &settings).await;
            let (first, second) = common::overlap(&db, conn_b, n, true, false).await;
            assert_eq!(first.unwrap(), Outcome::Processed(()));
            let error = second.expect_err("serialization failure");
            assert_eq!(classify(&error), ErrorClass::Transient, "{level}: {error}");
            let mut retry = common::connect_with(&db, &settings).await;
            assert_eq!(
                common::credit(&mut retry, &Credit::numbered(n))
                    .await
                    .unwrap(),
                Outcome::Duplicate,
                "{level}"
            );
        }
        assert_eq!(common::balances(&db, 2).await, vec![1, 1]);
    })
    .await;
    db.cleanup().await;
}

/// Credits the account; on its first run the body's session is terminated by the
/// server, as `pg_terminate_backend` or a failover does.
#[idempotent(consumer = "terminated", key = credit.message_id.as_str(), fast_path = false)]
async fn credit_terminated_once<C>(
    conn: &mut C,
    credit: &Credit,
    runs: &std::sync::atomic::AtomicUsize,
) -> Result<(), Error>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    conn.batch_execute(&format!(
        "UPDATE accounts SET balance = balance + 1 WHERE id = {}",
        credit.account
    ))
    .await?;
    if runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
        conn.batch_execute("SELECT pg_terminate_backend(pg_backend_pid())")
            .await?;
    }
    Ok(())
}

/// A run whose connection the server terminated is retried by the helper on a new
/// connection from the pool, and the message is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connection_is_retried_on_a_new_one() {
    let Some(db) = create("lost_connection").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(db.0.url());
        let pool = diesel_async::pooled_connection::deadpool::Pool::builder(manager)
            .max_size(1)
            .build()
            .unwrap();
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let errors = std::sync::Mutex::new(Vec::new());
        let outcome = diesel_inbox::retry(&diesel_inbox::RetryPolicy::new(), || async {
            let mut conn = pool.get().await?;
            let result = credit_terminated_once(&mut conn, &Credit::numbered(0), &runs).await;
            if let Err(error) = &result {
                errors.lock().unwrap().push(classify(error));
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(result?)
        })
        .await
        .expect("retried on a new connection");
        assert_eq!(outcome, Outcome::Processed(()));
        assert_eq!(
            errors.into_inner().unwrap(),
            vec![ErrorClass::ConnectionUnusable]
        );
        assert_eq!(common::balances(&db, 1).await, vec![1]);
    })
    .await;
    db.cleanup().await;
}

#[idempotent(consumer = "postgres-claimed", key = credit.message_id.as_str(), claim)]
async fn claimed(conn: &mut AsyncPgConnection, credit: &Credit) -> Result<(), Error> {
    common::apply(conn, credit).await
}

/// Functions named as the built-ins the crate's statements call, in a schema ahead of
/// the inbox's on `search_path`, are not called: PostgreSQL prefers an overload whose
/// parameter types fit better (`convert_from(bytea, text)` over the built-in's
/// `(bytea, name)`, `unnest(bytea[])` over `unnest(anyarray)`), whatever schema it is in.
/// Here they fold case and empty batches: keys differing in case only would be one
/// message, and a batch would find no marker of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn built_ins_shadowed_on_the_search_path_are_not_called() {
    let Some(db) = create("shadowed_built_ins").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 2).await;
        let url = db.database().url().to_owned();
        let schema = url
            .split("search_path%3D")
            .nth(1)
            .and_then(|rest| rest.split('&').next())
            .expect("the test schema")
            .to_owned();
        let shadow = format!("{schema}_shadow");
        let mut setup = db.connect().await;
        setup
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {shadow} CASCADE; CREATE SCHEMA {shadow}; \
                 CREATE FUNCTION {shadow}.convert_from(bytea, text) RETURNS text LANGUAGE sql \
                 AS $$ SELECT lower(pg_catalog.convert_from($1, $2::name)) $$; \
                 CREATE FUNCTION {shadow}.convert_to(text, text) RETURNS bytea LANGUAGE sql \
                 AS $$ SELECT pg_catalog.convert_to(lower($1), $2::name) $$; \
                 CREATE FUNCTION {shadow}.unnest(bytea[]) RETURNS SETOF bytea LANGUAGE sql \
                 AS $$ SELECT NULL::bytea WHERE false $$"
            ))
            .await
            .expect("the shadowing functions");
        let settings = format!("SET search_path = {shadow}, {schema}");
        let mut conn = common::connect_with(&db, &settings).await;
        for (key, account) in [("CaseKey", 0), ("casekey", 1)] {
            let credit = Credit::of(key, account);
            assert_eq!(
                common::credit(&mut conn, &credit).await,
                Ok(Outcome::Processed(())),
                "{key}"
            );
            assert_eq!(
                common::credit_reading_first(&mut conn, &credit).await,
                Ok(Outcome::Duplicate),
                "{key}"
            );
        }
        let batch = [Credit::of("CaseKey", 0), Credit::of("casekey", 1)];
        let processed = common::batch::batch_credit(&mut conn, &batch).await;
        assert_eq!(processed.map(|outcome| outcome.processed()), Ok(2));
        assert_eq!(common::balances(&db, 2).await, vec![2, 2]);
        setup
            .batch_execute(&format!("DROP SCHEMA {shadow} CASCADE"))
            .await
            .expect("drop the shadowing functions");
    })
    .await;
    db.cleanup().await;
}

/// Two replicas whose sessions differ in `client_encoding` must agree on every key:
/// bound as text, LATIN1 stored "é" as "Ã©", so the replica in UTF-8 processed the
/// message "é" again, and the message "Ã©" was taken for a duplicate of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_in_other_encodings_agree_on_keys() {
    let Some(db) = create("client_encodings").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 2).await;
        let mut latin1 = common::connect_with(&db, "SET client_encoding = 'LATIN1'").await;
        let mut utf8 = db.connect().await;
        // Each path: the transaction, the fast path's read, the batch, and claim mode.
        assert_eq!(
            common::credit(&mut latin1, &Credit::of("é", 0)).await,
            Ok(Outcome::Processed(()))
        );
        assert_eq!(
            common::credit(&mut utf8, &Credit::of("é", 0)).await,
            Ok(Outcome::Duplicate)
        );
        assert_eq!(
            common::credit_reading_first(&mut latin1, &Credit::of("é", 0)).await,
            Ok(Outcome::Duplicate)
        );
        assert_eq!(
            common::credit_reading_first(&mut latin1, &Credit::of("Ã©", 1)).await,
            Ok(Outcome::Processed(()))
        );
        let batch =
            common::batch::batch_credit(&mut latin1, &[Credit::of("é", 0), Credit::of("Ã©", 1)])
                .await
                .unwrap();
        assert_eq!(batch.processed(), 2);
        let batch =
            common::batch::batch_credit(&mut utf8, &[Credit::of("é", 0), Credit::of("Ã©", 1)])
                .await
                .unwrap();
        assert_eq!(batch.processed(), 0);
        assert_eq!(
            claimed(&mut latin1, &Credit::of("é", 0)).await,
            Ok(Outcome::Processed(()))
        );
        assert_eq!(
            claimed(&mut utf8, &Credit::of("é", 0)).await,
            Ok(Outcome::Duplicate)
        );
        assert_eq!(
            claimed(&mut utf8, &Credit::of("Ã©", 1)).await,
            Ok(Outcome::Processed(()))
        );
        let stored = "SELECT COUNT(*) FROM inbox WHERE message_id IN ('é', 'Ã©')";
        assert_eq!(select_i64(&mut utf8, stored).await.unwrap(), 6);
        assert_eq!(common::balances(&db, 2).await, vec![3, 3]);
    })
    .await;
    db.cleanup().await;
}

/// The inbox's statements are prepared once per connection and stay prepared: one
/// prepared again on every call costs a round trip and a parse of its own (diesel never
/// caches a `sql_query`). Each is found once among the session's prepared statements
/// after several calls of each kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_stay_prepared() {
    let Some(db) = create("statements_stay_prepared").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 4).await;
        let mut conn = db.connect().await;
        for n in 0..3 {
            let credit = Credit::numbered(n);
            assert_eq!(
                claimed(&mut conn, &credit).await,
                Ok(Outcome::Processed(()))
            );
            assert_eq!(
                common::credit_reading_first(&mut conn, &credit).await,
                Ok(Outcome::Processed(()))
            );
            let batch = [credit, Credit::numbered(3)];
            let outcome = common::batch::batch_credit(&mut conn, &batch).await;
            assert!(outcome.is_ok(), "{outcome:?}");
        }
        for statement in [
            "INSERT INTO inbox (message_id, consumer, lease_ends_at, claim_token",
            "UPDATE inbox SET lease_ends_at = NULL",
            "SELECT (SELECT lease_ends_at IS NULL FROM inbox",
            "INSERT INTO inbox (message_id, consumer, lease_ends_at) SELECT pg_catalog.convert_from($1",
            "FROM pg_catalog.unnest($2",
        ] {
            let prepared = format!(
                "SELECT COUNT(*) FROM pg_prepared_statements WHERE statement LIKE '%{statement}%' \
                 AND statement NOT LIKE '%pg_prepared_statements%'"
            );
            let count = select_i64(&mut conn, &prepared).await.unwrap();
            assert_eq!(count, 1, "{statement}");
        }
    })
    .await;
    db.cleanup().await;
}

/// Two replicas must agree on every key's digest whatever their sessions resolve and
/// parse: PostgreSQL inlines `inbox_key_digest` into the index expression and into the
/// lookups with the session's `search_path` and string syntax, so a function of one of
/// its names ahead of `pg_catalog`, or `standard_conforming_strings = off`, would give a
/// session digests of its own, and a redelivery to it would be processed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_that_resolve_names_otherwise_agree_on_digests() {
    let Some(db) = create("digest_sessions").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 2).await;
        let mut plain = db.connect().await;
        plain
            .batch_execute(
                "CREATE FUNCTION sha256(bytea) RETURNS bytea LANGUAGE sql IMMUTABLE \
                 AS 'SELECT pg_catalog.sha512($1)'; \
                 CREATE FUNCTION replace(text, text, text) RETURNS text LANGUAGE sql IMMUTABLE \
                 AS 'SELECT pg_catalog.upper($1)'",
            )
            .await
            .expect("the shadowing functions");
        // The test's schema, where the functions are, ahead of pg_catalog.
        let mut shadowed = common::connect_with(
            &db,
            "SELECT set_config('search_path', current_setting('search_path') || ', pg_catalog', \
             false); \
             SET standard_conforming_strings = off",
        )
        .await;
        for (index, message_id) in ["k", r"back\slash", r"\x41"].into_iter().enumerate() {
            let first = Credit::of(message_id, 0);
            assert_eq!(
                common::credit(&mut plain, &first).await,
                Ok(Outcome::Processed(()))
            );
            assert_eq!(
                common::credit(&mut shadowed, &first).await,
                Ok(Outcome::Duplicate),
                "{message_id:?}"
            );
            assert_eq!(
                common::credit_reading_first(&mut shadowed, &first).await,
                Ok(Outcome::Duplicate),
                "{message_id:?}"
            );
            let other = Credit::of(&format!("{message_id}-{index}"), 1);
            let batch = common::batch::batch_credit(&mut shadowed, &[first.clone(), other.clone()])
                .await
                .unwrap();
            assert_eq!(batch.processed(), 2);
            let batch = common::batch::batch_credit(&mut plain, &[first, other])
                .await
                .unwrap();
            assert_eq!(batch.processed(), 0, "{message_id:?}");
        }
        assert_eq!(common::balances(&db, 2).await, vec![6, 3]);
    })
    .await;
    db.cleanup().await;
}

/// A database in another encoding than UTF8 stores keys converted: LATIN1 cannot hold
/// most characters (a batch holding one failed as a whole, every message dead-lettered),
/// and EUC_JP stores U+00A6 and U+FFE4 as one (the second message was acknowledged as a
/// duplicate, unprocessed). `migrate` refuses such a database, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_refuses_a_database_not_encoded_in_utf8() {
    let Some(url) = common::server_url("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
    else {
        return;
    };
    bounded(async {
        let name = format!("inbox_encoding_{}", std::process::id());
        let mut admin = AsyncPgConnection::establish(&url).await.expect("connect");
        // One statement a query: a batch of several is a transaction, where neither
        // runs.
        let create = format!(
            "CREATE DATABASE {name} ENCODING 'EUC_JP' LC_COLLATE 'C' LC_CTYPE 'C' \
             TEMPLATE template0"
        );
        let drop_it = format!("DROP DATABASE IF EXISTS {name}");
        admin
            .batch_execute(&drop_it)
            .await
            .expect("drop a leftover");
        admin
            .batch_execute(&create)
            .await
            .expect("create the database");
        let elsewhere = match url.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("no database in {url}"),
        };
        let mut conn = AsyncPgConnection::establish(&elsewhere)
            .await
            .expect("connect");
        let refused = diesel_inbox::migrate(&mut conn).await;
        drop(conn);
        admin
            .batch_execute(&drop_it)
            .await
            .expect("drop the database");
        let error = refused.expect_err("an EUC_JP database is refused");
        assert!(
            error
                .to_string()
                .contains("needs a database encoded in UTF8")
                && error.to_string().contains("EUC_JP"),
            "{error}"
        );
    })
    .await;
}

/// `migrate` on an inbox and outbox that have it all sends no DDL: each instance calls
/// it at start-up, and a `CREATE INDEX IF NOT EXISTS` locked the table before it looked,
/// waiting for every open handler's transaction while every new insert queued behind
/// it (and deadlocked with `upgrade_unique_index`'s concurrent build). Nor does it need
/// the right to create anything: a role that may only read and write rows calls it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_with_nothing_to_do_takes_no_lock_and_needs_no_ddl_rights() {
    let Some(db) = create("migrate_nothing_to_do").await else {
        return;
    };
    bounded(async {
        let mut conn = db.connect().await;
        diesel_inbox::outbox::migrate(&mut conn)
            .await
            .expect("the outbox");
        let mut open = db.connect().await;
        open.batch_execute(
            "BEGIN; INSERT INTO inbox (message_id, consumer) VALUES ('held', 'c'); \
             INSERT INTO inbox_outbox (message_id, destination, routing_key, headers, payload) \
             VALUES ('held', 'd', '', '', '')",
        )
        .await
        .expect("a transaction left open on both tables");
        let at_once = Duration::from_secs(5);
        let inbox = tokio::time::timeout(at_once, diesel_inbox::migrate(&mut conn)).await;
        assert!(matches!(inbox, Ok(Ok(()))), "{inbox:?}");
        let outbox = tokio::time::timeout(at_once, diesel_inbox::outbox::migrate(&mut conn)).await;
        assert!(matches!(outbox, Ok(Ok(()))), "{outbox:?}");
        open.batch_execute("ROLLBACK").await.expect("rollback");

        let (inbox, outbox) = migrate_with_rows_only(&db, &mut conn).await;
        assert_eq!(inbox, Ok(()));
        assert_eq!(outbox, Ok(()));
    })
    .await;
    db.cleanup().await;
}

/// `migrate` on an inbox of 0.2 with markers, which keeps its index until
/// `upgrade_unique_index`, sends no DDL once the digest's function is there. It defined
/// the function again on every call, which a role that may only read and write rows may
/// not: every start-up failed, `Permanent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_on_an_inbox_of_0_2_with_markers_needs_no_ddl_rights() {
    let Some(db) = create("migrate_0_2_rows_only").await else {
        return;
    };
    bounded(async {
        let mut conn = db.connect().await;
        conn.batch_execute(
            "DROP INDEX ux_inbox_message_consumer; \
             CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox (message_id, consumer); \
             INSERT INTO inbox (message_id, consumer) VALUES ('m', 'c')",
        )
        .await
        .expect("an inbox of 0.2 with a marker");
        diesel_inbox::migrate(&mut conn)
            .await
            .expect("the digest's function");
        diesel_inbox::outbox::migrate(&mut conn)
            .await
            .expect("the outbox");
        let (inbox, outbox) = migrate_with_rows_only(&db, &mut conn).await;
        assert_eq!(inbox, Ok(()));
        assert_eq!(outbox, Ok(()));
    })
    .await;
    db.cleanup().await;
}

/// What `migrate` and `outbox::migrate` return on `conn` under a role that may only read
/// and write the rows of the test's schema.
async fn migrate_with_rows_only(
    db: &PgDb,
    conn: &mut AsyncPgConnection,
) -> (diesel::QueryResult<()>, diesel::QueryResult<()>) {
    let role = format!("{}_rows_only", db.0.name());
    let schema = db.0.name();
    conn.batch_execute(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; \
         GRANT USAGE ON SCHEMA {schema} TO {role}; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}; \
         SET ROLE {role}"
    ))
    .await
    .expect("a role that may only read and write rows");
    let inbox = diesel_inbox::migrate(conn).await;
    let outbox = diesel_inbox::outbox::migrate(conn).await;
    conn.batch_execute(&format!(
        "RESET ROLE; DROP OWNED BY {role}; DROP ROLE {role}"
    ))
    .await
    .expect("drop the role");
    (inbox, outbox)
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

/// `outbox::migrate` on an outbox it has to change waits for the table's lock a second at
/// a time: its `CREATE INDEX IF NOT EXISTS` waited for as long as a transaction stayed
/// open on the outbox, and every enqueue waited behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outbox_migrate_waits_for_its_lock_a_second_at_a_time() {
    let Some(db) = create("outbox_migrate_lock_waits").await else {
        return;
    };
    bounded(async {
        let mut conn = db.connect().await;
        diesel_inbox::outbox::migrate(&mut conn)
            .await
            .expect("the outbox");
        conn.batch_execute("DROP INDEX ix_inbox_outbox_sent")
            .await
            .expect("an outbox that lacks an index");
        let enqueue = "INSERT INTO inbox_outbox (message_id, destination, routing_key, \
                       headers, payload) VALUES ('m', 'd', '', '', '')";
        let mut held = db.connect().await;
        held.batch_execute(&format!("BEGIN; {enqueue}"))
            .await
            .expect("a transaction left open on the outbox");
        let holding = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            held.batch_execute("ROLLBACK").await
        });
        let migrating = tokio::spawn({
            let db = db.clone();
            async move { diesel_inbox::outbox::migrate(&mut db.connect().await).await }
        });
        // Time for migrate's schema change to queue up for the table's lock.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = std::time::Instant::now();
        conn.batch_execute(enqueue).await.expect("an enqueue");
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_millis(2500),
            "an enqueue waited {waited:?} behind migrate"
        );
        holding.await.unwrap().expect("end the open transaction");
        migrating
            .await
            .unwrap()
            .expect("migrate, once the transaction ended");
    })
    .await;
    db.cleanup().await;
}

/// `upgrade_unique_index` refuses a connection inside a transaction before it takes its
/// session's lock. It failed there, as documented, but kept the lock, whose release
/// failed in the aborted transaction: a pool kept the connection, and an upgrade
/// elsewhere waited an hour for it, then failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrade_unique_index_refuses_a_connection_in_a_transaction() {
    let Some(db) = create("upgrade_in_a_transaction").await else {
        return;
    };
    bounded(async {
        let mut conn = db.connect().await;
        conn.begin_test_transaction()
            .await
            .expect("a test transaction");
        assert_eq!(
            diesel_inbox::upgrade_unique_index(&mut conn).await,
            Err(Error::AlreadyInTransaction)
        );
        let locks = "SELECT COUNT(*) FROM pg_locks \
                     WHERE locktype = 'advisory' AND pid = pg_backend_pid()";
        assert_eq!(select_i64(&mut conn, locks).await, Ok(0));
    })
    .await;
    db.cleanup().await;
}

/// `upgrade_unique_index` on an inbox already upgraded sends no DDL, so that a session
/// that may only read finds it `Current`. It dropped 0.2's index whether it was there or
/// not, and failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrade_unique_index_with_nothing_to_do_only_reads() {
    let Some(db) = create("upgrade_read_only").await else {
        return;
    };
    bounded(async {
        let mut conn = common::connect_with(&db, "SET default_transaction_read_only = on").await;
        assert_eq!(
            diesel_inbox::upgrade_unique_index(&mut conn).await,
            Ok(diesel_inbox::schema::IndexUpgrade::Current)
        );
    })
    .await;
    db.cleanup().await;
}

/// A withdrawal-like claim-mode handler: never taken over once its lease ran out, and
/// its body started once at most.
#[idempotent(consumer = "stalled-claim", key = key, claim, takeover = false,
    max_attempts = 1, lease = Duration::from_millis(500))]
async fn stalled_claim(
    conn: &mut AsyncPgConnection,
    key: &str,
    runs: &std::sync::atomic::AtomicUsize,
) -> Result<(), Error> {
    let _ = conn;
    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// A claim whose commit (and each renewal's) used up most of its lease gives up before
/// its body, which never starts: the claim is released, and its attempt not counted, so
/// the next delivery runs the body. Left held, its lease ran out as if the body had run,
/// and with `takeover = false` the next delivery was quarantined and dead-lettered,
/// unprocessed; counted, it used up `max_attempts = 1` (`AttemptsExhausted`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_given_up_before_its_body_is_released() {
    let Some(db) = create("claim_given_up").await else {
        return;
    };
    bounded(async {
        let mut conn = db.connect().await;
        // Every write to the claim stalls past half its lease, as a Galera commit
        // waiting out a dead peer does. (A lease of 500 ms, so that a loaded machine's
        // own delays stay well within the other half.)
        conn.batch_execute(
            "CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$; \
             CREATE TRIGGER stall BEFORE INSERT OR UPDATE ON inbox FOR EACH ROW \
             WHEN (NEW.consumer = 'stalled-claim' AND NEW.claim_token IS NOT NULL) \
             EXECUTE FUNCTION stall()",
        )
        .await
        .expect("a stalling trigger");
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let given_up = stalled_claim(&mut conn, "m-1", &runs).await;
        let error = given_up.expect_err("the lease is used up before the body");
        assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0);

        conn.batch_execute("DROP TRIGGER stall ON inbox")
            .await
            .expect("the stall ends");
        // Past the lease: a claim left held would be quarantined now.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let redelivered = stalled_claim(&mut conn, "m-1", &runs).await;
        assert_eq!(redelivered, Ok(Outcome::Processed(())));
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    })
    .await;
    db.cleanup().await;
}

/// A claim-mode handler that, when told to, waits in its body for good.
#[idempotent(consumer = "claim-in-a-test", key = key, claim,
    lease = Duration::from_millis(200))]
async fn claimed_in_a_test(
    conn: &mut AsyncPgConnection,
    key: &str,
    hold: bool,
) -> Result<(), Error> {
    let _ = conn;
    if hold {
        std::future::pending::<()>().await;
    }
    Ok(())
}

/// Inside a test transaction a claim's lease ends as it does outside: each claim
/// statement reads the statement's time, where `now()`, the test transaction's start,
/// stood still and the claim of a delivery cut short stayed `InProgress` for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claims_lease_ends_inside_a_test_transaction() {
    let Some(db) = create("claim_lease_in_a_test").await else {
        return;
    };
    bounded(async {
        let mut conn = db.connect().await;
        conn.begin_test_transaction()
            .await
            .expect("a test transaction");
        let cut_short = tokio::time::timeout(
            Duration::from_millis(50),
            claimed_in_a_test(&mut conn, "m-1", true),
        )
        .await;
        assert!(cut_short.is_err(), "the body holds");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let redelivered = claimed_in_a_test(&mut conn, "m-1", false).await;
        assert_eq!(redelivered, Ok(Outcome::Processed(())));
    })
    .await;
    db.cleanup().await;
}
lost_connection_scenario!(
    create,
    own_id = "SELECT CAST(pg_backend_pid() AS bigint)",
    kill = "SELECT pg_terminate_backend({id})",
);
