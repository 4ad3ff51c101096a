//! PostgreSQL's unique index on the key's digest: a collision is never a duplicate, and
//! an inbox that 0.2 created upgrades to the digest while handlers run.

use crate::common;
use crate::postgres::create;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use diesel::result::Error;
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use diesel_inbox::schema::IndexUpgrade;
use diesel_inbox::testing::select_i64;
use diesel_inbox::{ErrorClass, InboxError, KeyCollision, Outcome, classify, idempotent};

use common::{Credit, TestDb, bounded};

#[idempotent(consumer = "collision-claimed", key = credit.message_id.as_str(), claim)]
async fn claimed(conn: &mut AsyncPgConnection, credit: &Credit) -> Result<(), Error> {
    common::apply(conn, credit).await
}

fn credit(message_id: &str, account: i64) -> Credit {
    Credit {
        message_id: message_id.to_owned(),
        account,
        amount: 1,
    }
}

/// The collision `result` carries, checked to be permanent.
fn collision<T: std::fmt::Debug>(result: Result<T, Error>) -> KeyCollision {
    let error = result.expect_err("a collision is an error");
    assert_eq!(classify(&error), ErrorClass::Permanent, "{error}");
    match InboxError::find(&error) {
        Some(InboxError::KeyCollision(collision)) => collision.clone(),
        other => panic!("expected a key collision, got {other:?}: {error}"),
    }
}

/// With a digest that collides for every key of one first letter, each mode meets
/// another key's marker. Each must refuse the message, write nothing and leave the
/// balance alone; the key's own marker is still a duplicate. Without the read-back that
/// compares keys, each collision would be acknowledged as a duplicate and lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_collision_is_an_error_never_a_duplicate() {
    let Some(db) = create("digest_collision").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 8).await;
        let mut conn = db.connect().await;
        conn.batch_execute(
            "CREATE OR REPLACE FUNCTION inbox_key_digest(consumer text, message_id text) \
             RETURNS uuid LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN \
             RETURN CAST(md5(left(message_id, 1)) AS uuid); END $$; \
             REINDEX INDEX ux_inbox_message_consumer",
        )
        .await
        .unwrap();

        assert_eq!(
            common::credit(&mut conn, &credit("a-1", 0)).await,
            Ok(Outcome::Processed(()))
        );
        assert_eq!(
            common::credit(&mut conn, &credit("a-1", 0)).await,
            Ok(Outcome::Duplicate)
        );
        let met = collision(common::credit(&mut conn, &credit("a-2", 1)).await);
        assert_eq!(
            (met.message_id.as_str(), met.consumer.as_str()),
            ("a-2", "credit")
        );
        assert_eq!(
            (met.stored_message_id.as_str(), met.stored_consumer.as_str()),
            ("a-1", "credit")
        );
        collision(common::credit_reading_first(&mut conn, &credit("a-3", 2)).await);

        // A batch meeting a committed marker, and one whose own keys collide.
        let batch = [credit("b-1", 3), credit("a-4", 4)];
        let met = collision(common::batch::batch_credit(&mut conn, &batch).await);
        assert_eq!(met.message_id, "a-4");
        let batch = [credit("c-1", 5), credit("c-2", 6)];
        let met = collision(common::batch::batch_credit(&mut conn, &batch).await);
        assert_eq!(
            (met.message_id.as_str(), met.stored_message_id.as_str()),
            ("c-2", "c-1")
        );

        // Claim mode, meeting another consumer's marker.
        let met = collision(claimed(&mut conn, &credit("a-5", 7)).await);
        assert_eq!(
            (met.consumer.as_str(), met.stored_consumer.as_str()),
            ("collision-claimed", "credit")
        );

        let markers = select_i64(&mut conn, "SELECT COUNT(*) FROM inbox").await;
        assert_eq!(markers, Ok(1), "only a-1's marker");
        assert_eq!(common::balances(&db, 8).await, vec![1, 0, 0, 0, 0, 0, 0, 0]);
    })
    .await;
    db.cleanup().await;
}

/// Markers in the inbox before the upgrade, where the CI's short run overrides it.
fn markers_before_upgrade() -> i64 {
    std::env::var("INBOX_UPGRADE_MARKERS")
        .ok()
        .and_then(|markers| markers.parse().ok())
        .unwrap_or(200_000)
}

/// An inbox of 0.2, its index on both texts and full of markers, upgrades while four
/// handlers deliver new messages and redeliver old ones: every message is processed
/// once, each redelivery is a duplicate, before, during and after the swap, and the
/// index ends on the digest. The longest handler call is printed; the bench measures.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_inbox_of_0_2_upgrades_while_handlers_run() {
    let Some(db) = create("upgrade_index").await else {
        return;
    };
    common::create_tables(&db, 4).await;
    let mut admin = db.connect().await;
    let markers = markers_before_upgrade();
    admin
        .batch_execute(&format!(
            "DROP INDEX ux_inbox_message_consumer; DROP FUNCTION inbox_key_digest(text, text); \
             CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox (message_id, consumer); \
             INSERT INTO inbox (message_id, consumer) \
             SELECT gen_random_uuid()::text, 'credit' FROM generate_series(1, {markers})"
        ))
        .await
        .unwrap();
    // This version's start-up leaves a full inbox's index as it is.
    diesel_inbox::migrate(&mut admin).await.unwrap();
    let index = "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() \
                 AND indexname = 'ux_inbox_message_consumer' AND indexdef LIKE '%inbox_key_digest%'";
    assert_eq!(select_i64(&mut admin, index).await, Ok(0));

    let stop = Arc::new(AtomicBool::new(false));
    let handlers: Vec<_> = (0..4)
        .map(|account| {
            let (db, stop) = (db.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut conn = db.connect().await;
                let (mut processed, mut longest) = (0, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) || processed < 50 {
                    let message = credit(&format!("u{account}-{processed}"), account);
                    let started = Instant::now();
                    let outcome = common::credit(&mut conn, &message).await;
                    longest = longest.max(started.elapsed());
                    assert_eq!(outcome, Ok(Outcome::Processed(())), "{message:?}");
                    let again = credit(&format!("u{account}-{}", processed / 2), account);
                    let outcome = common::credit(&mut conn, &again).await;
                    assert_eq!(outcome, Ok(Outcome::Duplicate), "{again:?}");
                    processed += 1;
                }
                (processed, longest)
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let upgrade = bounded(diesel_inbox::upgrade_unique_index(&mut admin)).await;
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
    eprintln!(
        "upgraded {markers} markers in {took:?}; {total} messages meanwhile, the longest \
         call {longest:?}"
    );
    assert_eq!(select_i64(&mut admin, index).await, Ok(1));
    let retired = "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() \
                   AND tablename = 'inbox'";
    assert_eq!(
        select_i64(&mut admin, retired).await,
        Ok(2),
        "the key and the digest"
    );
    let delivered = "SELECT COUNT(*) FROM inbox WHERE message_id LIKE 'u%'";
    assert_eq!(select_i64(&mut admin, delivered).await, Ok(total));
    assert_eq!(common::balances(&db, 4).await.iter().sum::<i64>(), total);
    assert_eq!(
        diesel_inbox::upgrade_unique_index(&mut admin).await,
        Ok(IndexUpgrade::Current)
    );
    drop(admin);
    db.cleanup().await;
}
