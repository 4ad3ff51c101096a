//! Handlers called inside one another's bodies, on one connection, and cancelled at
//! every await: each message is committed with its marker or not at all, the session is
//! as the caller had it (or the connection says it is unusable, and pools discard it),
//! and redeliveries finish the work exactly once. Against the real servers.

use std::future::Future;
use std::time::Duration;

use diesel::result::Error;
use diesel::sqlite::SqliteConnection as SyncSqlite;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, TransactionManager};
use diesel_inbox::testing::{TestConnection, TestDatabase, select_i64};
use diesel_inbox::{
    ErrorClass, InboxBackend, InboxError, NestedHandler, Outcome, classify, idempotent,
};

use crate::common;

type SqliteConnection = SyncConnectionWrapper<SyncSqlite>;

/// The claims' lease: short, so that the redeliveries take over a cancelled claim soon.
const LEASE: Duration = Duration::from_millis(300);

/// One message, handled by every kind of handler under the same key.
#[derive(Debug, Clone)]
struct Message {
    id: String,
}

/// Writes a row of `kind` for the message, as the body's business change.
async fn write<C: AsyncConnection>(conn: &mut C, id: &str, kind: &str) -> Result<(), Error> {
    conn.batch_execute(&format!(
        "INSERT INTO steps (message_id, kind) VALUES ('{id}', '{kind}')"
    ))
    .await
}

/// Two writes in a transaction with its marker: cancelled between them, neither may
/// stay.
#[idempotent(consumer = "compose-transactional", key = message.id.as_str())]
async fn transactional<C>(conn: &mut C, message: &Message) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    write(conn, &message.id, "transactional-1").await?;
    write(conn, &message.id, "transactional-2").await
}

#[idempotent(consumer = "compose-batch", batch = messages, key = |message| message.id.as_str())]
async fn batch<C>(conn: &mut C, messages: &[Message]) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    for message in messages {
        write(conn, &message.id, "batch").await?;
    }
    Ok(())
}

/// A claim inside the outer claim's body, on the same connection.
#[idempotent(consumer = "compose-inner-claim", key = message.id.as_str(), claim, lease = LEASE)]
async fn inner_claim<C>(conn: &mut C, message: &Message) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    conn.batch_execute("SELECT 1").await
}

/// Calls each kind of handler in turn. Work still in progress elsewhere fails the body,
/// so that the claim is released and the message redelivered.
#[idempotent(consumer = "compose-outer-claim", key = message.id.as_str(), claim, lease = LEASE)]
async fn outer_claim<C>(conn: &mut C, message: &Message) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    // Waits with the connection idle, outside any transaction, as for an external call.
    tokio::task::yield_now().await;
    // Processed, or a duplicate on a redelivery: either way the work is committed.
    let _: Outcome<()> = transactional(conn, message).await?;
    let _: diesel_inbox::BatchOutcome<()> = batch(conn, std::slice::from_ref(message)).await?;
    let inner = inner_claim(conn, message).await?;
    tokio::task::yield_now().await;
    match inner {
        Outcome::InProgress { .. } => Err(Error::RollbackTransaction),
        Outcome::Processed(()) | Outcome::Duplicate => Ok(()),
    }
}

/// A transactional body that calls a handler of each kind on its own connection, and
/// reports what each returned.
#[idempotent(consumer = "compose-calls-inside", key = message.id.as_str())]
async fn transactional_calling_handlers<C>(
    conn: &mut C,
    message: &Message,
) -> Result<[Option<Error>; 3], Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    transactional_calling_handlers_body(conn, message).await
}

/// Calls a handler of each kind under the message's inner key, and returns their errors.
async fn transactional_calling_handlers_body<C>(
    conn: &mut C,
    message: &Message,
) -> Result<[Option<Error>; 3], Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let inner = Message {
        id: format!("{}-inner", message.id),
    };
    Ok([
        transactional(conn, &inner).await.err(),
        batch(conn, std::slice::from_ref(&inner)).await.err(),
        inner_claim(conn, &inner).await.err(),
    ])
}

/// The same from a batch handler's body.
#[idempotent(consumer = "compose-batch-calls-inside", batch = messages,
             key = |message| message.id.as_str())]
async fn batch_calling_handlers<C>(
    conn: &mut C,
    messages: &[Message],
) -> Result<[Option<Error>; 3], Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    transactional_calling_handlers_body(conn, messages[0]).await
}

/// No handler runs inside a transactional or batch handler's body on that body's
/// connection: it would open its transaction inside the caller's. Each refuses, having
/// written nothing, with an error that says so, classified `Permanent`: a mistake of the
/// code, which no redelivery mends (as `AlreadyInTransaction`, it was retried forever).
async fn handlers_inside_a_transactional_body_refuse<C: TestConnection>(db: TestDatabase<C>) {
    let mut conn = db.connect().await.expect("connect");
    create_steps(&mut conn).await;
    let message = Message {
        id: "calls-inside".to_owned(),
    };
    let from_transactional = transactional_calling_handlers(&mut conn, &message)
        .await
        .expect("the transactional handler")
        .processed();
    let from_batch = batch_calling_handlers(&mut conn, std::slice::from_ref(&message))
        .await
        .expect("the batch handler")
        .into_value();
    for refusals in [from_transactional, from_batch] {
        let refusals = refusals.expect("the outer body ran");
        for refusal in refusals {
            let refusal = refusal.expect("refused");
            assert!(
                matches!(
                    InboxError::find(&refusal),
                    Some(InboxError::Nested(NestedHandler::InATransaction { .. }))
                ),
                "{refusal:?}"
            );
            assert_eq!(classify(&refusal), ErrorClass::Permanent);
        }
    }
    let inner = "SELECT COUNT(*) FROM inbox WHERE message_id = 'calls-inside-inner'";
    assert_eq!(select_i64(&mut conn, inner).await.unwrap(), 0);
    let rows = "SELECT COUNT(*) FROM steps";
    assert_eq!(select_i64(&mut conn, rows).await.unwrap(), 0);
}

/// Calls itself for the same message on `other`, a second connection, from its body, and
/// returns that call's error.
#[idempotent(consumer = "compose-recursive", key = message.id.as_str(), conn = conn)]
async fn recursive<C>(
    conn: &mut C,
    other: &mut C,
    message: &Message,
) -> Result<Option<Error>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    Ok(Box::pin(recursive(other, conn, message)).await.err())
}

/// A transactional handler whose body calls itself for the same message on a second
/// connection would wait for the marker its caller holds until the caller ends, which
/// is never (PostgreSQL waits without a limit). The inner call refuses at once.
async fn a_handler_called_for_its_own_message_refuses<C: TestConnection>(db: TestDatabase<C>) {
    let mut conn = db.connect().await.expect("connect");
    let mut other = db.connect().await.expect("connect");
    let message = Message {
        id: "recursive".to_owned(),
    };
    let outer = recursive(&mut conn, &mut other, &message).await;
    let refusal = outer.expect("the outer call").processed().flatten();
    let refusal = refusal.expect("the inner call refused");
    assert_eq!(
        InboxError::find(&refusal),
        Some(&InboxError::Nested(NestedHandler::SameMessage {
            consumer: "compose-recursive",
            message_id: "recursive".to_owned(),
        })),
        "{refusal}"
    );
    assert_eq!(classify(&refusal), ErrorClass::Permanent);
    let again = recursive(&mut other, &mut conn, &message).await;
    assert_eq!(again.expect("a redelivery"), Outcome::Duplicate);
}

/// Calls itself on `other`, a second connection, from its body, for its batch's last
/// new message, and returns that call's error.
#[idempotent(consumer = "compose-recursive-batch", batch = messages,
    key = |message| message.id.as_str(), conn = conn)]
async fn recursive_batch<C>(
    conn: &mut C,
    other: &mut C,
    messages: &[Message],
) -> Result<Option<Error>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let last: &Message = messages.last().expect("new messages");
    let inner = Box::pin(recursive_batch(other, conn, std::slice::from_ref(last))).await;
    Ok(inner.err())
}

/// A batch body that calls its own handler for any of its new messages, not only the
/// first, is refused at once: the call waited for the marker the batch holds, for good
/// on PostgreSQL.
async fn a_batch_called_for_a_later_message_refuses<C: TestConnection>(db: TestDatabase<C>) {
    let mut conn = db.connect().await.expect("connect");
    let mut other = db.connect().await.expect("connect");
    let messages = ["batch-first", "batch-last"].map(|id| Message { id: id.to_owned() });
    let outer = recursive_batch(&mut conn, &mut other, &messages).await;
    let refusal = outer.expect("the outer call").into_value().flatten();
    let refusal = refusal.expect("the inner call refused");
    assert_eq!(
        InboxError::find(&refusal),
        Some(&InboxError::Nested(NestedHandler::SameMessage {
            consumer: "compose-recursive-batch",
            message_id: "batch-last".to_owned(),
        })),
        "{refusal}"
    );
}

async fn create_steps<C: TestConnection>(conn: &mut C) {
    conn.batch_execute(
        "CREATE TABLE steps (message_id VARCHAR(64) NOT NULL, kind VARCHAR(32) NOT NULL)",
    )
    .await
    .expect("create steps");
}

/// How many rows of `kind` (a `LIKE` pattern) the message has, and how many markers of
/// `consumer`, completed ones only, read on `conn` in one statement: a COMMIT that a
/// cancelled call left in flight must not land between the two counts.
async fn count<C: TestConnection>(
    conn: &mut C,
    id: &str,
    kind: &str,
    consumer: &str,
) -> (i64, i64) {
    let both = format!(
        "SELECT (SELECT COUNT(*) FROM steps WHERE message_id = '{id}' AND kind LIKE '{kind}') \
         * 1000 + (SELECT COUNT(*) FROM inbox WHERE message_id = '{id}' \
         AND consumer = '{consumer}' AND lease_ends_at IS NULL)"
    );
    let both = select_i64(conn, &both)
        .await
        .expect("count rows and markers");
    (both / 1000, both % 1000)
}

/// Seen from another connection, each transactional message is whole: both rows with
/// its marker, or neither and no marker; the batch's row with its marker, or neither.
async fn assert_whole<C: TestConnection>(other: &mut C, id: &str) {
    let transactional = count(other, id, "transactional-%", "compose-transactional").await;
    assert!(
        matches!(transactional, (0, 0) | (2, 1)),
        "{id}: transactional rows and marker {transactional:?}"
    );
    let batch = count(other, id, "batch", "compose-batch").await;
    assert!(
        matches!(batch, (0, 0) | (1, 1)),
        "{id}: batch row and marker {batch:?}"
    );
}

/// Runs the outer claim on a connection in the caller's `session`, cancelled after each
/// number of waits in turn until a run finishes, and checks after each cancellation
/// what the database and the connection show; then redelivers every message until it
/// is settled, and checks that each was applied exactly once.
///
/// `session` is the caller's: the statement that sets it, a query that reads it back,
/// and what that must read.
async fn every_cancellation_leaves_whole_messages<C: TestConnection>(
    db: TestDatabase<C>,
    session: (&str, &str, i64),
) {
    let (session, probe) = (session.0, (session.1, session.2));
    let mut other = db.connect().await.expect("connect");
    create_steps(&mut other).await;
    let mut ids = Vec::new();
    for pendings in 1.. {
        let message = Message {
            id: format!("cancelled-at-{pendings}"),
        };
        ids.push(message.id.clone());
        let mut conn = db.connect().await.expect("connect");
        conn.batch_execute(session)
            .await
            .expect("the caller's session");
        let finished = common::drop_after(pendings, outer_claim(&mut conn, &message)).await;
        assert_whole(&mut other, &message.id).await;

        // A connection left inside a transaction says so, and pools discard it. One
        // cut off in the middle of a reply (mysql_async leaves it so) fails its next
        // statement as a lost connection, which pools discard too. Any other is as the
        // caller had it, and serves the next handler.
        let usable = !C::TransactionManager::is_broken_transaction_manager(&mut conn)
            && match select_i64(&mut conn, probe.0).await {
                Ok(found) => {
                    assert_eq!(found, probe.1, "{}: {}", message.id, probe.0);
                    true
                }
                Err(error) => {
                    assert_eq!(
                        classify(&error),
                        ErrorClass::ConnectionUnusable,
                        "{}: {error}",
                        message.id
                    );
                    false
                }
            };
        if usable {
            let probe = Message {
                id: format!("probe-{pendings}"),
            };
            assert_eq!(
                transactional(&mut conn, &probe)
                    .await
                    .expect("the next handler"),
                Outcome::Processed(())
            );
            assert_eq!(
                count(
                    &mut other,
                    &probe.id,
                    "transactional-%",
                    "compose-transactional"
                )
                .await,
                (2, 1),
                "after {}, the next handler's work is committed",
                message.id
            );
        }
        drop(conn);
        if let Some(outcome) = finished {
            assert_eq!(outcome.expect("the whole run"), Outcome::Processed(()));
            // The outer claim's completion is committed, after an inner claim on the
            // same connection completed its own.
            let outer = count(&mut other, &message.id, "%", "compose-outer-claim").await;
            assert_eq!(outer.1, 1, "the outer claim is completed");
            break;
        }
    }
    let cancellations = ids.len() - 1;
    assert!(
        cancellations > 5,
        "cancelled at {cancellations} points only"
    );
    eprintln!("cancelled at {cancellations} points");

    // Redeliveries settle every message: a claim left by a cancellation is taken over
    // once its lease ends.
    let mut conn = db.connect().await.expect("connect");
    conn.batch_execute(session)
        .await
        .expect("the caller's session");
    for id in &ids {
        let message = Message { id: id.clone() };
        let mut settled = false;
        for _ in 0..20 {
            match outer_claim(&mut conn, &message).await {
                Ok(Outcome::Processed(()) | Outcome::Duplicate) => {
                    settled = true;
                    break;
                }
                Ok(Outcome::InProgress { .. }) | Err(_) => tokio::time::sleep(LEASE).await,
            }
        }
        assert!(settled, "{id} was never settled");
        assert_eq!(
            count(&mut other, id, "transactional-%", "compose-transactional").await,
            (2, 1),
            "{id}"
        );
        assert_eq!(
            count(&mut other, id, "batch", "compose-batch").await,
            (1, 1),
            "{id}"
        );
        for consumer in ["compose-inner-claim", "compose-outer-claim"] {
            assert_eq!(
                count(&mut other, id, "%", consumer).await.1,
                1,
                "{id}: {consumer}"
            );
        }
    }
}

/// Runs `scenario` on `db`, where its server is configured, then removes `db`.
async fn run_on<C: TestConnection, F: Future<Output = ()>>(
    db: Option<TestDatabase<C>>,
    scenario: impl FnOnce(TestDatabase<C>) -> F,
) {
    let Some(db) = db else {
        return;
    };
    common::bounded(scenario(db.clone())).await;
    db.cleanup().await.expect("cleanup");
}

async fn postgres(name: &str) -> Option<TestDatabase<AsyncPgConnection>> {
    let url = common::server_url("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")?;
    Some(TestDatabase::postgres(&url, name).await.expect("schema"))
}

async fn mysql(name: &str) -> Option<TestDatabase<AsyncMysqlConnection>> {
    let url = common::server_url("MYSQL_URL", "mysql://root@127.0.0.1:3306/test")?;
    Some(TestDatabase::mysql(&url, name).await.expect("database"))
}

async fn sqlite(name: &str) -> Option<TestDatabase<SqliteConnection>> {
    Some(TestDatabase::sqlite(name).await.expect("file"))
}

/// What a session without settings of its own reads: nothing to compare but that the
/// connection still answers.
const ANY_SESSION: (&str, &str, i64) = ("SELECT 1", "SELECT COUNT(*) FROM inbox WHERE 1 = 0", 0);

/// A MySQL/MariaDB session with autocommit off, as a server's `autocommit = 0` or an
/// `init_connect` leaves every session.
const AUTOCOMMIT_OFF: (&str, &str, i64) = ("SET autocommit = 0", "SELECT @@autocommit", 0);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_on_postgres() {
    let db = postgres("compose_cancelled").await;
    run_on(db, |db| {
        every_cancellation_leaves_whole_messages(db, ANY_SESSION)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_on_mysql() {
    let db = mysql("compose_cancelled").await;
    run_on(db, |db| {
        every_cancellation_leaves_whole_messages(db, ANY_SESSION)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_on_mysql_with_autocommit_off() {
    let db = mysql("compose_cancelled_autocommit_off").await;
    run_on(db, |db| {
        every_cancellation_leaves_whole_messages(db, AUTOCOMMIT_OFF)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_on_sqlite() {
    let db = sqlite("compose_cancelled").await;
    run_on(db, |db| {
        every_cancellation_leaves_whole_messages(db, ANY_SESSION)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recursion_refused_on_postgres() {
    let db = postgres("compose_recursion").await;
    run_on(db, a_handler_called_for_its_own_message_refuses).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recursion_refused_on_mysql() {
    let db = mysql("compose_recursion").await;
    run_on(db, a_handler_called_for_its_own_message_refuses).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recursion_refused_on_sqlite() {
    let db = sqlite("compose_recursion").await;
    run_on(db, a_handler_called_for_its_own_message_refuses).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_recursion_refused_on_postgres() {
    let db = postgres("compose_batch_recursion").await;
    run_on(db, a_batch_called_for_a_later_message_refuses).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_recursion_refused_on_mysql() {
    let db = mysql("compose_batch_recursion").await;
    run_on(db, a_batch_called_for_a_later_message_refuses).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_recursion_refused_on_sqlite() {
    let db = sqlite("compose_batch_recursion").await;
    run_on(db, a_batch_called_for_a_later_message_refuses).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_on_postgres() {
    let db = postgres("compose_refused").await;
    run_on(db, handlers_inside_a_transactional_body_refuse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_on_mysql() {
    let db = mysql("compose_refused").await;
    run_on(db, handlers_inside_a_transactional_body_refuse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_on_sqlite() {
    let db = sqlite("compose_refused").await;
    run_on(db, handlers_inside_a_transactional_body_refuse).await;
}
