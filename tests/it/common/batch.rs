//! Batch handlers, on every backend: `#[idempotent(batch = …)]` applies each message of
//! a batch exactly once, whatever the batches overlap with.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use diesel::result::Error;
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use diesel_inbox::testing::select_i64;
use diesel_inbox::{
    BatchOutcome, ErrorClass, InboxBackend, InboxError, InvalidBatchKey, InvalidKey, Outcome,
    classify, idempotent,
};
use tokio::sync::Barrier;

use super::{
    Credit, Gate, RaceReport, TestDb, apply, balances, connect_with, create_tables, settled,
    until_a_lock_waits,
};

/// The batch handler under test: credits each new message, waiting at `gate` once all are
/// applied, then succeeds or fails as the gate says. Returns how many it credited.
#[idempotent(consumer = "batch_credit", batch = credits, key = |credit| credit.message_id.as_str())]
pub async fn gated_batch_credit<C>(
    conn: &mut C,
    credits: &[Credit],
    gate: &Gate,
) -> Result<usize, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    // Real handlers do work between reading and writing; it widens every race.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let credited = credits.len();
    for credit in credits {
        apply(conn, credit).await?;
    }
    if gate.hold {
        gate.entered.notify_one();
        gate.release.notified().await;
    }
    if gate.fail {
        return Err(Error::RollbackTransaction);
    }
    Ok(credited)
}

pub async fn batch_credit<C>(conn: &mut C, credits: &[Credit]) -> Result<BatchOutcome<usize>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    gated_batch_credit(conn, credits, &Gate::new(false, false)).await
}

/// What a batch handler that checks, then inserts, each message would do: the race must
/// catch it. Returns how many messages it took for new, and how many for duplicates.
async fn naive_batch_credit<D: TestDb>(
    conn: &mut D::Conn,
    credits: &[Credit],
) -> Result<(usize, usize), Error> {
    let mut new: Vec<&Credit> = Vec::new();
    for credit in credits {
        let seen = select_i64(
            conn,
            &format!(
                "SELECT COUNT(*) FROM naive_inbox WHERE message_id = '{}' AND consumer = 'naive'",
                credit.message_id
            ),
        )
        .await?;
        if seen == 0 && !new.iter().any(|c| c.message_id == credit.message_id) {
            new.push(credit);
        }
    }
    conn.transaction(async |conn| {
        tokio::time::sleep(Duration::from_millis(1)).await;
        for credit in &new {
            conn.batch_execute(&format!(
                "INSERT INTO naive_inbox (message_id, consumer) VALUES ('{}', 'naive')",
                credit.message_id
            ))
            .await?;
            apply(conn, credit).await?;
        }
        Ok::<_, Error>(())
    })
    .await?;
    Ok((new.len(), credits.len() - new.len()))
}

/// Delivers a batch to the idempotent handler, checking what its outcome says of itself.
async fn idempotent_batch_credit<D: TestDb>(
    conn: &mut D::Conn,
    credits: &[Credit],
) -> Result<(usize, usize), Error> {
    let outcome = D::batch_credit(conn, credits).await?;
    assert_eq!(outcome.outcomes().len(), credits.len());
    assert_eq!(outcome.value().copied().unwrap_or(0), outcome.processed());
    Ok((outcome.processed(), outcome.duplicates()))
}

/// The batches worker `worker` delivers in round `round`: the round's messages, rotated
/// and split differently for each worker, so that the workers' batches overlap in every
/// composition, and start together.
fn compositions(worker: usize, round: i64, per_round: i64) -> Vec<Vec<Credit>> {
    let mut ids: Vec<i64> = (0..per_round).map(|n| round * per_round + n).collect();
    ids.rotate_left(worker * 3 % per_round as usize);
    if worker % 2 == 1 {
        ids.reverse();
    }
    let split = 1 + worker % (per_round as usize - 1);
    let (first, second) = ids.split_at(split);
    // Every worker also sends one message of the round twice in its first batch.
    let mut first: Vec<Credit> = first.iter().map(|&n| Credit::numbered(n)).collect();
    first.push(Credit::numbered(second[0]));
    vec![first, second.iter().map(|&n| Credit::numbered(n)).collect()]
}

async fn batch_race<D: TestDb>(db: Arc<D>, naive: bool, workers: usize, rounds: i64) -> RaceReport {
    const PER_ROUND: i64 = 8;
    let messages = rounds * PER_ROUND;
    create_tables(&*db, messages).await;
    let barrier = Arc::new(Barrier::new(workers));
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let db = Arc::clone(&db);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut conn = db.connect().await;
            let mut report = RaceReport::default();
            for round in 0..rounds {
                barrier.wait().await;
                for batch in compositions(worker, round, PER_ROUND) {
                    let mut retries = 0;
                    let (processed, duplicates) = loop {
                        let result = if naive {
                            naive_batch_credit::<D>(&mut conn, &batch).await
                        } else {
                            idempotent_batch_credit::<D>(&mut conn, &batch).await
                        };
                        if let Some(counts) = settled(result, &batch, &mut retries) {
                            break counts;
                        }
                    };
                    report.processed += processed;
                    report.duplicates += duplicates;
                    report.transient_retries += retries;
                }
            }
            report
        }));
    }
    RaceReport::of_workers(&*db, messages, tasks).await
}

pub async fn batch_races_apply_each_message_exactly_once<D: TestDb>(db: D) {
    let (workers, rounds) = (4, 12);
    let report = batch_race(Arc::new(db), false, workers, rounds).await;
    assert_eq!(
        report.wrong,
        vec![],
        "messages applied other than once: {report:?}"
    );
    let messages = rounds as usize * 8;
    assert_eq!(report.processed, messages, "{report:?}");
    // Each worker delivers each message once, and one message per round twice.
    assert_eq!(
        report.processed + report.duplicates,
        workers * (messages + rounds as usize),
        "{report:?}"
    );
}

pub async fn batch_race_catches_the_naive_handler<D: TestDb>(db: D) {
    let report = batch_race(Arc::new(db), true, 4, 12).await;
    assert!(
        report.wrong.iter().any(|(_, balance)| *balance > 1),
        "the race must make the naive batch handler apply some message twice: {report:?}"
    );
}

/// Two copies of a key in one batch: the first is processed, the second is its duplicate.
pub async fn batch_counts_a_repeated_key_once<D: TestDb>(db: D) {
    create_tables(&db, 3).await;
    let mut conn = db.connect().await;
    let batch: Vec<Credit> = [0, 1, 0, 2, 1].into_iter().map(Credit::numbered).collect();
    let outcome = batch_credit(&mut conn, &batch).await.unwrap();
    use Outcome::{Duplicate as D, Processed as P};
    assert_eq!(outcome.outcomes(), [P(()), P(()), D, P(()), D]);
    assert_eq!(outcome.value(), Some(&3));
    assert_eq!(balances(&db, 3).await, vec![1, 1, 1]);

    let again = batch_credit(&mut conn, &batch).await.unwrap();
    assert_eq!(again.outcomes(), [D, D, D, D, D]);
    assert_eq!(
        again.value(),
        None,
        "the body does not run for duplicates only"
    );
    assert_eq!(
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .unwrap(),
        3
    );
}

/// A batch of new messages, committed duplicates and a message held by another delivery's
/// open transaction: the batch waits for the holder, then finds the held message a
/// duplicate if the holder committed, new if it rolled back.
pub async fn mixed_batch_waits_for_the_holder<D: TestDb>(db: D, holder_commits: bool) {
    mixed_batch_in_session(db, holder_commits, None).await;
}

/// [`mixed_batch_waits_for_the_holder`], the mixed batch's connection first running
/// `settings`, if any.
pub async fn mixed_batch_in_session<D: TestDb>(
    db: D,
    holder_commits: bool,
    settings: Option<&str>,
) {
    create_tables(&db, 4).await;
    let mut conn = match settings {
        Some(settings) => connect_with(&db, settings).await,
        None => db.connect().await,
    };
    let committed = batch_credit(&mut conn, &[Credit::numbered(0)])
        .await
        .unwrap();
    assert_eq!(committed.processed(), 1);

    let gate = Gate::held(!holder_commits);
    let holder = {
        let gate = Arc::clone(&gate);
        let mut conn = db.connect().await;
        tokio::spawn(
            async move { gated_batch_credit(&mut conn, &[Credit::numbered(1)], &gate).await },
        )
    };
    gate.entered.notified().await;
    let mixed = tokio::spawn(async move {
        let batch: Vec<Credit> = [2, 0, 1, 3].into_iter().map(Credit::numbered).collect();
        batch_credit(&mut conn, &batch).await
    });
    until_a_lock_waits(&db).await;
    assert!(
        !mixed.is_finished(),
        "the batch must wait while message 1 is held"
    );
    gate.release.notify_one();

    let holder = holder.await.unwrap();
    let mixed = mixed.await.unwrap().expect("the mixed batch");
    use Outcome::{Duplicate as D, Processed as P};
    if holder_commits {
        assert_eq!(holder.unwrap().processed(), 1);
        assert_eq!(mixed.outcomes(), [P(()), D, D, P(())]);
    } else {
        assert!(
            matches!(holder, Err(Error::RollbackTransaction)),
            "{holder:?}"
        );
        assert_eq!(mixed.outcomes(), [P(()), D, P(()), P(())]);
    }
    assert_eq!(balances(&db, 4).await, vec![1, 1, 1, 1]);
}

pub async fn mixed_batch_after_the_holder_commits<D: TestDb>(db: D) {
    mixed_batch_waits_for_the_holder(db, true).await;
}

pub async fn mixed_batch_after_the_holder_rolls_back<D: TestDb>(db: D) {
    mixed_batch_waits_for_the_holder(db, false).await;
}

async fn inbox_rows<D: TestDb>(db: &D) -> i64 {
    let mut observer = db.connect().await;
    select_i64(&mut observer, "SELECT COUNT(*) FROM inbox")
        .await
        .unwrap()
}

/// A failing body rolls back every marker of the batch, so a redelivery processes all.
pub async fn failing_batch_rolls_back_every_marker<D: TestDb>(db: D) {
    create_tables(&db, 5).await;
    let mut conn = db.connect().await;
    let batch: Vec<Credit> = (0..5).map(Credit::numbered).collect();
    let failed = gated_batch_credit(&mut conn, &batch, &Gate::new(false, true)).await;
    assert!(
        matches!(failed, Err(Error::RollbackTransaction)),
        "{failed:?}"
    );
    assert_eq!(inbox_rows(&db).await, 0);
    assert_eq!(balances(&db, 5).await, vec![0; 5]);

    let redelivered = batch_credit(&mut conn, &batch).await.unwrap();
    assert_eq!(redelivered.processed(), 5);
    assert_eq!(balances(&db, 5).await, vec![1; 5]);
}

/// A batch dropped inside its body commits nothing, and its connection is refused.
pub async fn cancelled_batch_commits_nothing<D: TestDb>(db: D) {
    create_tables(&db, 3).await;
    let batch: Vec<Credit> = (0..3).map(Credit::numbered).collect();
    let mut conn = db.connect().await;
    let gate = Gate::held(false);
    {
        let handler = gated_batch_credit(&mut conn, &batch, &gate);
        tokio::pin!(handler);
        tokio::select! {
            outcome = &mut handler => panic!("a held batch returned {outcome:?}"),
            () = gate.entered.notified() => {}
        }
    }
    let reused = batch_credit(&mut conn, &batch).await;
    let error = reused.expect_err("a connection left inside a transaction is refused");
    assert_eq!(
        classify(&error),
        ErrorClass::ConnectionUnusable,
        "{error:?}"
    );
    assert_eq!(
        inbox_rows(&db).await,
        0,
        "nothing of the dropped batch is committed"
    );
    drop(conn);

    let mut fresh = db.connect().await;
    assert_eq!(
        batch_credit(&mut fresh, &batch).await.unwrap().processed(),
        3
    );
    assert_eq!(balances(&db, 3).await, vec![1; 3]);
}

/// The body carries on after its transaction ended underneath it: `swallowed` is a
/// statement that ends or aborts it, whose error the body ignores. Nothing commits, and
/// the error is transient.
pub async fn batch_rolled_back_underneath_commits_nothing<D: TestDb>(
    db: D,
    swallowed: &'static str,
) {
    #[idempotent(consumer = "batch_swallowing", batch = credits, key = |credit| credit.message_id.as_str())]
    async fn swallowing<C>(conn: &mut C, credits: &[Credit], swallowed: &str) -> Result<(), Error>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
    {
        for credit in credits {
            apply(conn, credit).await?;
        }
        let _ignored = conn.batch_execute(swallowed).await;
        Ok(())
    }

    create_tables(&db, 2).await;
    let mut conn = db.connect().await;
    let batch = [Credit::numbered(0), Credit::numbered(1)];
    let error = swallowing(&mut conn, &batch, swallowed)
        .await
        .expect_err("a transaction rolled back underneath is not processed");
    assert!(classify(&error).is_retryable(), "{error}");
    assert_eq!(inbox_rows(&db).await, 0);
    assert_eq!(balances(&db, 2).await, vec![0, 0]);
    drop(conn);
    let mut fresh = db.connect().await;
    assert_eq!(
        batch_credit(&mut fresh, &batch).await.unwrap().processed(),
        2
    );
}

/// More markers than the backend's bind-parameter limit allows in one statement (two
/// parameters each, 65,535 at most): the batch still goes in whole, and its redelivery
/// is all duplicates.
pub async fn batch_beyond_the_bind_limit<D: TestDb>(db: D) {
    #[idempotent(consumer = "batch_count", batch = credits, key = |credit| credit.message_id.as_str())]
    async fn count<C>(_conn: &mut C, credits: &[Credit]) -> Result<usize, Error>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
    {
        Ok(credits.len())
    }

    const MESSAGES: i64 = 33_000;
    let batch: Vec<Credit> = (0..MESSAGES).map(Credit::numbered).collect();
    let mut conn = db.connect().await;
    let outcome = count(&mut conn, &batch).await.unwrap();
    assert_eq!(outcome.value(), Some(&(MESSAGES as usize)));
    assert_eq!(outcome.processed(), MESSAGES as usize);
    assert_eq!(inbox_rows(&db).await, MESSAGES);
    let again = count(&mut conn, &batch).await.unwrap();
    assert_eq!(again.duplicates(), MESSAGES as usize);
    assert_eq!(again.value(), None);
}

/// An empty batch is a no-op: no transaction, so not even a connection inside one is
/// refused, and nothing is written.
pub async fn empty_batch_is_a_no_op<D: TestDb>(db: D) {
    create_tables(&db, 0).await;
    let mut conn = db.connect().await;
    let outcome = batch_credit(&mut conn, &[]).await.unwrap();
    assert_eq!(outcome.outcomes(), []);
    assert_eq!(outcome.value(), None);
    assert_eq!(inbox_rows(&db).await, 0);
}

/// One invalid key rejects the whole batch before anything is written, naming the
/// message; the others then go through on their own.
pub async fn invalid_key_rejects_the_whole_batch<D: TestDb>(db: D) {
    create_tables(&db, 4).await;
    let mut conn = db.connect().await;
    let mut batch: Vec<Credit> = (0..4).map(Credit::numbered).collect();
    batch[2].message_id.clear();
    let error = batch_credit(&mut conn, &batch).await.unwrap_err();
    assert_eq!(
        InboxError::find(&error),
        Some(&InboxError::InvalidBatchKey(InvalidBatchKey {
            index: 2,
            reason: InvalidKey::Empty
        }))
    );
    assert_eq!(classify(&error), ErrorClass::Permanent);
    assert!(
        error.to_string().contains("message 2 of the batch"),
        "{error}"
    );
    assert_eq!(inbox_rows(&db).await, 0);
    assert_eq!(balances(&db, 4).await, vec![0; 4]);

    batch.remove(2);
    assert_eq!(
        batch_credit(&mut conn, &batch).await.unwrap().processed(),
        3
    );
}

/// Inside a test transaction a batch runs on a savepoint, as a single message does.
pub async fn batch_runs_inside_a_test_transaction<D: TestDb>(db: D) {
    create_tables(&db, 3).await;
    let mut conn = db.connect().await;
    conn.begin_test_transaction().await.unwrap();
    let first = batch_credit(&mut conn, &[Credit::numbered(0), Credit::numbered(1)])
        .await
        .unwrap();
    assert_eq!(first.processed(), 2);
    let second = batch_credit(&mut conn, &[Credit::numbered(1), Credit::numbered(2)])
        .await
        .unwrap();
    use Outcome::{Duplicate as D, Processed as P};
    assert_eq!(second.outcomes(), [D, P(())]);
    let failed =
        gated_batch_credit(&mut conn, &[Credit::numbered(3)], &Gate::new(false, true)).await;
    assert!(
        matches!(failed, Err(Error::RollbackTransaction)),
        "{failed:?}"
    );
    assert_eq!(
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .unwrap(),
        3
    );
    drop(conn);
    assert_eq!(
        inbox_rows(&db).await,
        0,
        "a test transaction commits nothing"
    );
}

/// A message that is `Send` but not `Sync`, as one holding a `Cell` is.
pub struct UnsyncCredit {
    credit: Credit,
    applied: Cell<bool>,
}

impl UnsyncCredit {
    fn numbered(n: i64) -> Self {
        Self {
            credit: Credit::numbered(n),
            applied: Cell::new(false),
        }
    }
}

/// Takes its batch by value: the body owns the new messages, so that its future is
/// `Send` although they are not `Sync`, as a plain `async fn`'s would be. Returns the
/// ids it applied.
#[idempotent(
    consumer = "owned_batch_credit",
    batch = credits,
    key = |unsync| unsync.credit.message_id.as_str()
)]
pub async fn owned_batch_credit<C>(
    conn: &mut C,
    credits: Vec<UnsyncCredit>,
) -> Result<Vec<String>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut applied = Vec::new();
    for unsync in credits {
        apply(conn, &unsync.credit).await?;
        unsync.applied.set(true);
        if unsync.applied.get() {
            applied.push(unsync.credit.message_id);
        }
    }
    Ok(applied)
}

/// A batch of messages that are not `Sync`, taken by value, in a spawned task: the body
/// gets the new messages themselves, each once.
pub async fn owned_unsync_batch_runs_in_a_spawned_task<D: TestDb>(db: D) {
    create_tables(&db, 3).await;
    let spawned = |batch: Vec<UnsyncCredit>| {
        let db = db.clone();
        tokio::spawn(async move {
            let mut conn = db.connect().await;
            owned_batch_credit(&mut conn, batch).await
        })
    };
    use Outcome::{Duplicate as D, Processed as P};
    let batch = [0, 1, 0].map(UnsyncCredit::numbered);
    let first = spawned(batch.into()).await.unwrap().unwrap();
    assert_eq!(first.outcomes(), [P(()), P(()), D]);
    assert_eq!(
        first.value(),
        Some(&vec!["msg-0".to_owned(), "msg-1".to_owned()])
    );
    let batch = [1, 2].map(UnsyncCredit::numbered);
    let second = spawned(batch.into()).await.unwrap().unwrap();
    assert_eq!(second.outcomes(), [D, P(())]);
    assert_eq!(second.value(), Some(&vec!["msg-2".to_owned()]));
    assert_eq!(balances(&db, 3).await, vec![1, 1, 1]);
}

/// Returns borrows of its messages, as a plain `async fn` taking `&'a [Credit]` may.
#[idempotent(consumer = "lending_batch_credit", batch = credits, key = |credit| credit.message_id.as_str())]
pub async fn lending_batch_credit<'a, C>(
    conn: &mut C,
    credits: &'a [Credit],
) -> Result<Vec<&'a str>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut applied = Vec::new();
    for credit in credits {
        apply(conn, credit).await?;
        applied.push(credit.message_id.as_str());
    }
    Ok(applied)
}

/// A batch body's value borrows from the batch's messages: the new ones', each once.
pub async fn lending_batch_returns_borrows_of_its_messages<D: TestDb>(db: D) {
    create_tables(&db, 3).await;
    let mut conn = db.connect().await;
    let batch = [0, 1, 0].map(Credit::numbered);
    let first = lending_batch_credit(&mut conn, &batch).await.unwrap();
    use Outcome::{Duplicate as D, Processed as P};
    assert_eq!(first.outcomes(), [P(()), P(()), D]);
    let applied = first.into_value().unwrap();
    assert_eq!(applied, ["msg-0", "msg-1"]);
    assert!(
        std::ptr::eq(applied[1], batch[1].message_id.as_str()),
        "the value borrows from the batch itself"
    );
    let batch = [1, 2].map(Credit::numbered);
    let second = lending_batch_credit(&mut conn, &batch).await.unwrap();
    assert_eq!(second.outcomes(), [D, P(())]);
    assert_eq!(second.into_value().unwrap(), ["msg-2"]);
    assert_eq!(balances(&db, 3).await, vec![1, 1, 1]);
}

/// Every batch scenario, as one `#[tokio::test]` each, and the rolled-back-underneath
/// one with the statement the backend's body swallows.
macro_rules! batch_scenarios {
    ($db:expr, swallowed = $swallowed:expr) => {
        batch_scenarios!(@tests $db;
            batch_races_apply_each_message_exactly_once,
            batch_race_catches_the_naive_handler,
            batch_counts_a_repeated_key_once,
            mixed_batch_after_the_holder_commits,
            mixed_batch_after_the_holder_rolls_back,
            failing_batch_rolls_back_every_marker,
            cancelled_batch_commits_nothing,
            batch_beyond_the_bind_limit,
            empty_batch_is_a_no_op,
            invalid_key_rejects_the_whole_batch,
            batch_runs_inside_a_test_transaction,
            owned_unsync_batch_runs_in_a_spawned_task,
            lending_batch_returns_borrows_of_its_messages,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn batch_rolled_back_underneath_commits_nothing() {
            if let Some(db) = $db("batch_rolled_back_underneath").await {
                common::bounded(common::batch::batch_rolled_back_underneath_commits_nothing(
                    db.clone(),
                    $swallowed,
                ))
                .await;
                common::TestDb::cleanup(db).await;
            }
        }
    };
    (@tests $db:expr; $($scenario:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $scenario() {
            if let Some(db) = $db(stringify!($scenario)).await {
                common::bounded(common::batch::$scenario(db.clone())).await;
                common::TestDb::cleanup(db).await;
            }
        }
    )*};
}
