//! PostgreSQL handlers that name their connection's type, as most services write them:
//! their transactions begin with BEGIN and the marker insert in one round trip. The
//! shared scenarios that race, batch and cancel run here on such handlers; the
//! PostgreSQL suite runs them on generic ones, which begin in two.

use crate::common;
use crate::postgres::{PgDb, create};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::connection::InstrumentationEvent;
use diesel::result::Error;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use diesel_inbox::testing::{TestDatabase, select_i64};
use diesel_inbox::{BatchOutcome, Outcome, idempotent};

use common::{Credit, Gate, TestDb, bounded};

/// The PostgreSQL suite's database, delivering to the handlers below.
#[derive(Clone)]
struct NamedDb(PgDb);

impl TestDb for NamedDb {
    type Conn = AsyncPgConnection;

    fn database(&self) -> &TestDatabase<AsyncPgConnection> {
        self.0.database()
    }

    fn lock_waiters(&self) -> impl Future<Output = Option<i64>> + Send {
        self.0.lock_waiters()
    }

    fn credit(
        conn: &mut AsyncPgConnection,
        credit: &Credit,
        gate: &Gate,
    ) -> impl Future<Output = Result<Outcome<()>, Error>> + Send {
        named_credit(conn, credit, gate)
    }

    fn batch_credit(
        conn: &mut AsyncPgConnection,
        credits: &[Credit],
    ) -> impl Future<Output = Result<BatchOutcome<usize>, Error>> + Send {
        named_batch_credit(conn, credits)
    }
}

async fn create_named(test: &str) -> Option<NamedDb> {
    create(test).await.map(NamedDb)
}

/// `common::gated_credit`, with its connection's type named.
#[idempotent(consumer = "named-credit", key = credit.message_id.as_str(), fast_path = gate.read_first)]
async fn named_credit(
    conn: &mut AsyncPgConnection,
    credit: &Credit,
    gate: &Gate,
) -> Result<(), Error> {
    tokio::time::sleep(Duration::from_millis(1)).await;
    common::apply(conn, credit).await?;
    if gate.hold {
        gate.entered.notify_one();
        gate.release.notified().await;
    }
    if gate.fail {
        return Err(Error::RollbackTransaction);
    }
    Ok(())
}

/// `common::batch::batch_credit`, with its connection's type named.
#[idempotent(consumer = "named-batch-credit", batch = credits, key = |credit| credit.message_id.as_str())]
async fn named_batch_credit(
    conn: &mut AsyncPgConnection,
    credits: &[Credit],
) -> Result<usize, Error> {
    tokio::time::sleep(Duration::from_millis(1)).await;
    let credited = credits.len();
    for credit in credits {
        common::apply(conn, credit).await?;
    }
    Ok(credited)
}

/// The same handler on a pool's guard, with a payload fingerprint.
#[idempotent(consumer = "pooled-credit", key = credit.message_id.as_str(), fingerprint = credit.amount.to_le_bytes())]
async fn pooled_credit(conn: &mut Object<AsyncPgConnection>, credit: &Credit) -> Result<(), Error> {
    common::apply(conn, credit).await
}

macro_rules! named_scenarios {
    ($($scenario:path => $test:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            if let Some(db) = create_named(stringify!($test)).await {
                bounded($scenario(db.clone())).await;
                db.cleanup().await;
            }
        }
    )*};
}

named_scenarios!(
    common::races_apply_each_message_exactly_once => races_apply_each_message_exactly_once,
    common::batch::batch_races_apply_each_message_exactly_once => batch_races_apply_each_message_exactly_once,
    common::cancelled_transaction_statements_never_half_commit => cancelled_transaction_statements_never_half_commit,
);

/// Records the statements a connection sends.
fn record_statements(conn: &mut AsyncPgConnection) -> Arc<Mutex<Vec<String>>> {
    let statements = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&statements);
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event {
            seen.lock().unwrap().push(query.to_string());
        }
    });
    statements
}

/// Whether the statements began a transaction in one round trip with the marker insert:
/// the pipelined BEGIN is the one that sets the flag its insert looks for.
fn pipelined(statements: &Mutex<Vec<String>>) -> bool {
    let mut statements = statements.lock().unwrap();
    let pipelined = statements
        .iter()
        .any(|sql| sql.starts_with("BEGIN") && sql.contains("diesel_inbox.marker_transaction"));
    statements.clear();
    pipelined
}

/// A handler that names `AsyncPgConnection`, or a pool's guard of one, pipelines; a
/// generic one does not. Either way a new message is processed once, a redelivery is a
/// duplicate, and a failed body commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_naming_their_connection_pipeline() {
    let Some(db) = create_named("handlers_naming_their_connection_pipeline").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 4).await;
        let mut conn = db.connect().await;
        let statements = record_statements(&mut conn);
        let open = Gate::new(false, false);

        let failing = Gate::new(false, true);
        let failed = named_credit(&mut conn, &Credit::numbered(0), &failing).await;
        assert_eq!(failed, Err(Error::RollbackTransaction));
        assert!(pipelined(&statements));
        for expected in [Outcome::Processed(()), Outcome::Duplicate] {
            let outcome = named_credit(&mut conn, &Credit::numbered(0), &open).await;
            assert_eq!(outcome, Ok(expected));
            assert!(pipelined(&statements));
        }
        let batch = [Credit::numbered(0), Credit::numbered(1)];
        let outcome = named_batch_credit(&mut conn, &batch).await.unwrap();
        assert_eq!((outcome.processed(), outcome.duplicates()), (2, 0));
        assert!(pipelined(&statements));
        let outcome = named_batch_credit(&mut conn, &batch).await.unwrap();
        assert_eq!((outcome.processed(), outcome.duplicates()), (0, 2));
        assert!(pipelined(&statements));

        let generic = common::credit(&mut conn, &Credit::numbered(2)).await;
        assert_eq!(generic, Ok(Outcome::Processed(())));
        assert!(
            !pipelined(&statements),
            "a generic handler begins in sequence"
        );

        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(db.0.0.url());
        let pool = Pool::builder(manager).max_size(1).build().unwrap();
        let mut pooled = pool.get().await.unwrap();
        let statements = record_statements(&mut pooled);
        let outcome = pooled_credit(&mut pooled, &Credit::numbered(3)).await;
        assert_eq!(outcome, Ok(Outcome::Processed(())));
        assert!(pipelined(&statements));
        let mut changed = Credit::numbered(3);
        changed.amount += 1;
        let mismatch = pooled_credit(&mut pooled, &changed).await.unwrap_err();
        assert!(
            matches!(
                diesel_inbox::InboxError::find(&mismatch),
                Some(diesel_inbox::InboxError::FingerprintMismatch(_))
            ),
            "{mismatch:?}"
        );

        assert_eq!(common::balances(&db, 4).await, vec![2, 1, 1, 1]);
    })
    .await;
    db.cleanup().await;
}

/// The pipelined insert binds its key after the BEGIN batch has set the transaction's
/// encoding to UTF-8: a session in LATIN1 stores the key's UTF-8 bytes, and finds it
/// again from a session in UTF-8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_stored_as_encoded_in_latin1() {
    let Some(db) = create_named("pipelined_keys_in_latin1").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let open = Gate::new(false, false);
        let credit = Credit {
            message_id: String::from("clé-ü-€-\u{1F600}"),
            account: 0,
            amount: 1,
        };
        let mut latin1 = db.connect().await;
        latin1
            .batch_execute("SET client_encoding = 'LATIN1'")
            .await
            .unwrap();
        let outcome = named_credit(&mut latin1, &credit, &open).await;
        assert_eq!(outcome, Ok(Outcome::Processed(())));

        let mut utf8 = db.connect().await;
        let stored = format!(
            "SELECT COUNT(*) FROM inbox WHERE consumer = 'named-credit' \
             AND upper(encode(convert_to(message_id, 'UTF8'), 'hex')) = '{}'",
            common::keys::utf8_hex(&credit.message_id)
        );
        assert_eq!(select_i64(&mut utf8, &stored).await.unwrap(), 1);
        let again = named_credit(&mut utf8, &credit, &open).await;
        assert_eq!(again, Ok(Outcome::Duplicate));
    })
    .await;
    db.cleanup().await;
}
