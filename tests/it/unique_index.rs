//! The unique index on the key's digest, on PostgreSQL and MySQL/MariaDB: a collision is
//! never a duplicate, and an inbox that 0.2 created upgrades to the digest while handlers
//! run.

use crate::{common, mysql, postgres};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use diesel::result::Error;
use diesel_async::{AsyncConnection, SimpleAsyncConnection, TransactionManager as _};
use diesel_inbox::schema::IndexUpgrade;
use diesel_inbox::testing::select_i64;
use diesel_inbox::{
    ErrorClass, InboxBackend, InboxError, KeyCollision, Outcome, classify, idempotent,
};

use common::{Credit, TestDb, bounded};

#[idempotent(consumer = "collision-claimed", key = credit.message_id.as_str(), claim)]
async fn claimed<C>(conn: &mut C, credit: &Credit) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    common::apply(conn, credit).await
}

#[idempotent(consumer = "upgrade-claimed", key = credit.message_id.as_str(), claim)]
async fn claimed_during_upgrade<C>(conn: &mut C, credit: &Credit) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    common::apply(conn, credit).await
}

/// What each backend's test needs written in its own SQL.
struct Dialect {
    /// Makes every two keys whose digests start with the same byte collide.
    weak_digest: &'static str,
    /// Turns the inbox back into 0.2's, with `{markers}` random markers.
    back_to_0_2: &'static str,
    /// Counts 1 when the unique index is on the digest.
    on_digest: &'static str,
    /// Counts the inbox's indexes.
    indexes: &'static str,
    /// Counts what an upgrade cut short may leave: an index not yet valid, a table or a
    /// trigger of the crate's.
    leftovers: &'static str,
    /// Whether the marker that the weakened index takes for a collision's is found by
    /// its digest, as a real collision's is. MySQL's index can only be weakened to a
    /// prefix of the digest, which the lookup by the whole digest does not meet: the
    /// collision is then an error that a redelivery retries, never a duplicate either.
    finds_the_holder: bool,
    /// Counts 1 where a session keeps a setting of the upgrade's: what a call dropped
    /// midway must not hand to a pool's next user.
    upgrade_setting_left: &'static str,
}

const POSTGRES: Dialect = Dialect {
    weak_digest: "CREATE OR REPLACE FUNCTION inbox_key_digest(consumer text, message_id text) \
         RETURNS uuid LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN \
         RETURN CAST(md5(left(encode(sha256(convert_to(consumer, 'UTF8') || decode('00', 'hex') \
         || convert_to(message_id, 'UTF8')), 'hex'), 2)) AS uuid); END $$; \
         REINDEX INDEX ux_inbox_message_consumer",
    back_to_0_2: "DROP INDEX ux_inbox_message_consumer; \
         DROP FUNCTION inbox_key_digest(text, text); \
         CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox (message_id, consumer); \
         INSERT INTO inbox (message_id, consumer) \
         SELECT gen_random_uuid()::text, 'credit' FROM generate_series(1, {markers})",
    // The catalog's rows alone, as `upgrade_unique_index` reads them: pg_indexes calls
    // pg_get_indexdef, which can fail on another test's index as that test drops it
    // ("cache lookup failed for attribute 1 of relation …").
    on_digest: "SELECT COUNT(*) FROM pg_depend WHERE classid = 'pg_class'::regclass \
         AND objid = to_regclass('ux_inbox_message_consumer') \
         AND refclassid = 'pg_proc'::regclass \
         AND refobjid = to_regprocedure('inbox_key_digest(text,text)')",
    indexes: "SELECT COUNT(*) FROM pg_index WHERE indrelid = to_regclass('inbox')",
    leftovers: "SELECT COUNT(*) FROM pg_index WHERE indrelid = to_regclass('inbox') \
         AND NOT indisvalid",
    finds_the_holder: true,
    // Its settings are the swap's transaction's own (`SET LOCAL`).
    upgrade_setting_left: "SELECT CAST(0 AS bigint)",
};

const MYSQL: Dialect = Dialect {
    weak_digest: "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer, \
         ADD UNIQUE INDEX ux_inbox_message_consumer (key_digest(1))",
    back_to_0_2: "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer, DROP COLUMN key_digest, \
         ADD UNIQUE INDEX ux_inbox_message_consumer (message_id, consumer); \
         INSERT INTO inbox (message_id, consumer) \
         SELECT UUID(), 'credit' FROM seq_1_to_{markers}",
    on_digest: "SELECT COUNT(*) FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = 'inbox' \
         AND index_name = 'ux_inbox_message_consumer' AND column_name = 'key_digest'",
    indexes: "SELECT COUNT(DISTINCT index_name) FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = 'inbox'",
    leftovers: "SELECT (SELECT COUNT(*) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name LIKE 'diesel\\_inbox\\_%') \
         + (SELECT COUNT(*) FROM information_schema.triggers \
         WHERE trigger_schema = DATABASE())",
    finds_the_holder: false,
    upgrade_setting_left: "SELECT @@SESSION.lock_wait_timeout = 1",
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_digest_collision_is_an_error_never_a_duplicate() {
    if let Some(db) = postgres::create("digest_collision").await {
        a_digest_collision_is_an_error_never_a_duplicate(db, &POSTGRES).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_digest_collision_is_an_error_never_a_duplicate() {
    if let Some(db) = mysql::create("digest_collision").await {
        a_digest_collision_is_an_error_never_a_duplicate(db, &MYSQL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_full_inbox_of_0_2_upgrades_while_handlers_run() {
    if let Some(db) = postgres::create("upgrade_index").await {
        a_full_inbox_of_0_2_upgrades_while_handlers_run(db, &POSTGRES).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_a_full_inbox_of_0_2_upgrades_while_handlers_run() {
    if let Some(db) = mysql::create("upgrade_index").await {
        a_full_inbox_of_0_2_upgrades_while_handlers_run(db, &MYSQL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_an_upgrade_cut_short_is_finished_by_the_next() {
    if let Some(db) = postgres::create("upgrade_cut_short").await {
        an_upgrade_cut_short_is_finished_by_the_next(db, &POSTGRES).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_an_upgrade_cut_short_is_finished_by_the_next() {
    if let Some(db) = mysql::create("upgrade_cut_short").await {
        an_upgrade_cut_short_is_finished_by_the_next(db, &MYSQL).await;
    }
}

/// The first byte of the digest of (consumer, key), as both backends compute it.
fn digest_byte(consumer: &str, key: &str) -> u8 {
    use sha2::Digest as _;

    sha2::Sha256::digest([consumer.as_bytes(), &[0], key.as_bytes()].concat())[0]
}

/// The first `count` keys `{prefix}-{n}` whose digest for `consumer` starts with a byte
/// that `wanted` accepts.
fn keys(consumer: &str, prefix: &str, count: usize, wanted: impl Fn(u8) -> bool) -> Vec<String> {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .filter(|key| wanted(digest_byte(consumer, key)))
        .take(count)
        .collect()
}

/// The collision `result` carries, checked to be permanent, where the dialect's
/// weakened index lets the marker holding the digest be found; elsewhere an error all
/// the same, never a duplicate.
fn collision<T: std::fmt::Debug>(
    result: Result<T, Error>,
    dialect: &Dialect,
) -> Option<KeyCollision> {
    let error = result.expect_err("a collision is an error, never a duplicate");
    if !dialect.finds_the_holder {
        return None;
    }
    assert_eq!(classify(&error), ErrorClass::Permanent, "{error}");
    match InboxError::find(&error) {
        Some(InboxError::KeyCollision(collision)) => Some(collision.clone()),
        other => panic!("expected a key collision, got {other:?}: {error}"),
    }
}

/// With an index that takes two digests with the same first byte for one, each mode meets
/// another key's marker. Each must refuse the message, write nothing and leave the
/// balance alone; the key's own marker is still a duplicate. Without the read-back that
/// compares keys, each collision would be acknowledged as a duplicate and lost.
async fn a_digest_collision_is_an_error_never_a_duplicate<D: TestDb>(db: D, dialect: &Dialect) {
    bounded(async {
        common::create_tables(&db, 8).await;
        let mut conn = db.connect().await;
        conn.batch_execute(dialect.weak_digest).await.unwrap();

        // Keys of family `a` collide with each other, in either consumer, and so do
        // those of family `c`; `b` collides with neither.
        let a_byte = digest_byte("credit", "a-0");
        let a = keys("credit", "a", 3, |byte| byte == a_byte);
        let a_batch = keys("batch_credit", "a", 1, |byte| byte == a_byte);
        let a_claimed = keys("collision-claimed", "a", 1, |byte| byte == a_byte);
        let c_byte = digest_byte("batch_credit", "c-0");
        let c = keys("batch_credit", "c", 2, |byte| byte == c_byte);
        let b = keys("batch_credit", "b", 1, |byte| {
            byte != a_byte && byte != c_byte
        });
        assert_ne!(a_byte, c_byte, "two families");

        assert_eq!(
            common::credit(&mut conn, &Credit::of(&a[0], 0)).await,
            Ok(Outcome::Processed(()))
        );
        assert_eq!(
            common::credit(&mut conn, &Credit::of(&a[0], 0)).await,
            Ok(Outcome::Duplicate)
        );
        let met = collision(
            common::credit(&mut conn, &Credit::of(&a[1], 1)).await,
            dialect,
        );
        if let Some(met) = met {
            assert_eq!(
                (met.message_id.as_str(), met.consumer.as_str()),
                (a[1].as_str(), "credit")
            );
            assert_eq!(
                (met.stored_message_id.as_str(), met.stored_consumer.as_str()),
                (a[0].as_str(), "credit")
            );
        }
        let reading_first = common::credit_reading_first(&mut conn, &Credit::of(&a[2], 2)).await;
        collision(reading_first, dialect);

        // A batch meeting a committed marker, and one whose own keys collide.
        let batch = [Credit::of(&b[0], 3), Credit::of(&a_batch[0], 4)];
        let met = collision(
            common::batch::batch_credit(&mut conn, &batch).await,
            dialect,
        );
        if let Some(met) = met {
            assert_eq!(met.message_id, a_batch[0]);
        }
        let batch = [Credit::of(&c[0], 5), Credit::of(&c[1], 6)];
        let met = collision(
            common::batch::batch_credit(&mut conn, &batch).await,
            dialect,
        );
        if let Some(met) = met {
            let mut pair = [met.message_id, met.stored_message_id];
            pair.sort();
            assert_eq!(pair, [c[0].clone(), c[1].clone()]);
        }

        // Claim mode, meeting another consumer's marker.
        let met = collision(
            claimed(&mut conn, &Credit::of(&a_claimed[0], 7)).await,
            dialect,
        );
        if let Some(met) = met {
            assert_eq!(
                (met.consumer.as_str(), met.stored_consumer.as_str()),
                ("collision-claimed", "credit")
            );
        }

        let markers = select_i64(&mut conn, "SELECT COUNT(*) FROM inbox").await;
        assert_eq!(markers, Ok(1), "only the first key's marker");
        assert_eq!(common::balances(&db, 8).await, vec![1, 0, 0, 0, 0, 0, 0, 0]);
    })
    .await;
    db.cleanup().await;
}

/// Markers in the inbox before the upgrade, where the CI's short run overrides it.
/// An upgrade whose call is dropped partway, its connection closed, while a handler
/// runs, is finished by the next call: the index ends on the digest, nothing of the
/// first call is left, and every message is processed once.
async fn an_upgrade_cut_short_is_finished_by_the_next<D>(db: D, dialect: &Dialect)
where
    D: TestDb + Clone + Send + Sync + 'static,
{
    common::create_tables(&db, 1).await;
    let mut admin = db.connect().await;
    let back_to_0_2 = dialect.back_to_0_2.replace("{markers}", "200000");
    admin.batch_execute(&back_to_0_2).await.unwrap();
    diesel_inbox::migrate(&mut admin).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let handler = {
        let (db, stop) = (db.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut conn = db.connect().await;
            let mut processed = 0;
            while !stop.load(Ordering::Relaxed) || processed < 50 {
                let message = Credit::of(&format!("u-{processed}"), 0);
                let outcome = common::credit(&mut conn, &message).await;
                assert_eq!(outcome, Ok(Outcome::Processed(())), "{message:?}");
                let again = Credit::of(&format!("u-{}", processed / 2), 0);
                let outcome = common::credit(&mut conn, &again).await;
                assert_eq!(outcome, Ok(Outcome::Duplicate), "{again:?}");
                processed += 1;
            }
            processed
        })
    };

    // A tenth of a second: the copy, or the index build, is under way.
    let mut cut_short = db.connect().await;
    let first = tokio::time::timeout(
        Duration::from_millis(100),
        diesel_inbox::upgrade_unique_index(&mut cut_short),
    )
    .await;
    assert!(
        first.is_err(),
        "the first call was still running when dropped"
    );
    // A pool discards a connection that reads as broken; one that does not must not
    // keep the upgrade's settings, which would make its next user's lock waits fail.
    let broken = <D::Conn as AsyncConnection>::TransactionManager::is_broken_transaction_manager(
        &mut cut_short,
    );
    if !broken {
        let left = select_i64(&mut cut_short, dialect.upgrade_setting_left).await;
        assert_eq!(left, Ok(0), "a setting of the dropped upgrade's is left");
    }
    drop(cut_short);
    // The server may finish the first call's work on its own (MariaDB's `ALTER`), which
    // the second then finds done; the index is checked below either way.
    let second = bounded(diesel_inbox::upgrade_unique_index(&mut admin)).await;
    assert!(
        matches!(second, Ok(IndexUpgrade::Rebuilt | IndexUpgrade::Current)),
        "{second:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let processed = bounded(handler).await.expect("the handler task");

    assert_eq!(select_i64(&mut admin, dialect.on_digest).await, Ok(1));
    assert_eq!(select_i64(&mut admin, dialect.leftovers).await, Ok(0));
    let delivered = "SELECT COUNT(*) FROM inbox WHERE message_id LIKE 'u-%'";
    assert_eq!(select_i64(&mut admin, delivered).await, Ok(processed));
    let markers = "SELECT COUNT(*) FROM inbox";
    assert_eq!(
        select_i64(&mut admin, markers).await,
        Ok(200_000 + processed)
    );
    assert_eq!(common::balances(&db, 1).await, vec![processed]);
    drop(admin);
    db.cleanup().await;
}

fn markers_before_upgrade() -> i64 {
    std::env::var("INBOX_UPGRADE_MARKERS")
        .ok()
        .and_then(|markers| markers.parse().ok())
        .unwrap_or(200_000)
}

/// An inbox of 0.2, its index on both texts and full of markers, upgrades while four
/// handlers deliver new messages and redeliver old ones, and a claim-mode handler
/// claims and completes others: every message is processed once, each redelivery is a
/// duplicate, before, during and after the swap, and the index ends on the digest. The
/// longest handler call is printed; the bench measures.
async fn a_full_inbox_of_0_2_upgrades_while_handlers_run<D>(db: D, dialect: &Dialect)
where
    D: TestDb + Clone + Send + Sync + 'static,
{
    // Accounts 0 to 3 for the transactional handlers, 4 for the claim-mode one.
    common::create_tables(&db, 5).await;
    let mut admin = db.connect().await;
    let markers = markers_before_upgrade();
    let back_to_0_2 = dialect
        .back_to_0_2
        .replace("{markers}", &markers.to_string());
    admin.batch_execute(&back_to_0_2).await.unwrap();
    // This version's start-up leaves a full inbox's index as it is.
    diesel_inbox::migrate(&mut admin).await.unwrap();
    let index = dialect.on_digest;
    assert_eq!(select_i64(&mut admin, index).await, Ok(0));

    let stop = Arc::new(AtomicBool::new(false));
    let handlers: Vec<_> = (0..4)
        .map(|account| {
            let (db, stop) = (db.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut conn = db.connect().await;
                let (mut processed, mut longest) = (0, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) || processed < 50 {
                    let message = Credit::of(&format!("u{account}-{processed}"), account);
                    let started = Instant::now();
                    let outcome = common::credit(&mut conn, &message).await;
                    longest = longest.max(started.elapsed());
                    assert_eq!(outcome, Ok(Outcome::Processed(())), "{message:?}");
                    let again = Credit::of(&format!("u{account}-{}", processed / 2), account);
                    let outcome = common::credit(&mut conn, &again).await;
                    assert_eq!(outcome, Ok(Outcome::Duplicate), "{again:?}");
                    processed += 1;
                }
                (processed, longest)
            })
        })
        .collect();
    // A claim's completion updates its marker: one completed while the upgrade copies
    // must not be found still claimed afterwards.
    let claims = {
        let (db, stop) = (db.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut conn = db.connect().await;
            let mut processed = 0;
            while !stop.load(Ordering::Relaxed) || processed < 50 {
                let message = Credit::of(&format!("c-{processed}"), 4);
                let outcome = claimed_during_upgrade(&mut conn, &message).await;
                assert_eq!(outcome, Ok(Outcome::Processed(())), "{message:?}");
                processed += 1;
            }
            processed
        })
    };

    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    // Two minutes, and one more for each million markers in a long run.
    let bound = Duration::from_secs(120 + 60 * u64::try_from(markers / 1_000_000).unwrap_or(0));
    let upgrade = tokio::time::timeout(bound, diesel_inbox::upgrade_unique_index(&mut admin))
        .await
        .expect("the upgrade did not finish in time");
    let took = started.elapsed();
    assert_eq!(upgrade, Ok(IndexUpgrade::Rebuilt));
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);

    let mut total = 0;
    let mut longest = Duration::ZERO;
    for handler in handlers {
        let (processed, slowest) = bounded(handler).await.expect("the handler task");
        total += processed;
        longest = longest.max(slowest);
    }
    let claimed = bounded(claims).await.expect("the claim-mode task");
    for processed in 0..claimed {
        let again = Credit::of(&format!("c-{processed}"), 4);
        let outcome = claimed_during_upgrade(&mut admin, &again).await;
        assert_eq!(outcome, Ok(Outcome::Duplicate), "{again:?}");
    }
    eprintln!(
        "upgraded {markers} markers in {took:?}; {total} messages and {claimed} claims \
         meanwhile, the longest call {longest:?}"
    );
    assert_eq!(select_i64(&mut admin, index).await, Ok(1));
    assert_eq!(
        select_i64(&mut admin, dialect.indexes).await,
        Ok(2),
        "the key and the digest"
    );
    let delivered = "SELECT COUNT(*) FROM inbox WHERE message_id LIKE 'u%'";
    assert_eq!(select_i64(&mut admin, delivered).await, Ok(total));
    let balances = common::balances(&db, 5).await;
    assert_eq!(balances[..4].iter().sum::<i64>(), total);
    assert_eq!(balances[4], claimed);
    assert_eq!(
        diesel_inbox::upgrade_unique_index(&mut admin).await,
        Ok(IndexUpgrade::Current)
    );
    drop(admin);
    db.cleanup().await;
}
