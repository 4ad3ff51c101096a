//! The start-up check finds a consumer name shared across crates, which `cargo check`
//! cannot see: `inbox_test_refunds::refund` also calls itself "credit".

use diesel::result::Error;
use diesel_async::AsyncConnection;
use diesel_inbox::{InboxBackend, check_consumers, idempotent, registered_handlers};

#[idempotent(consumer = "credit", key = id)]
async fn credit<C>(conn: &mut C, id: u64) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let _ = conn;
    Ok(())
}

#[idempotent(consumer = "audit", key = id)]
async fn audit<C>(conn: &mut C, id: u64) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let _ = conn;
    Ok(())
}

#[expect(
    dead_code,
    reason = "a handler is registered without ever being called"
)]
struct Ledger;

impl Ledger {
    #[idempotent(consumer = "ledger", key = id)]
    async fn post<C>(&self, conn: &mut C, id: u64) -> Result<(), Error>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
    {
        let _ = conn;
        Ok(())
    }
}

/// The line of `Ledger::post`.
const POST_LINE: u32 = line!() - 11;

#[test]
fn every_linked_handler_is_registered() {
    let mut handlers: Vec<_> = registered_handlers()
        .map(|registered| (registered.consumer, registered.handler))
        .collect();
    handlers.sort_unstable();
    assert_eq!(
        handlers,
        [
            ("audit", "consumers::audit"),
            ("credit", "consumers::credit"),
            ("credit", "inbox_test_refunds::refund"),
            (
                "ledger",
                &*format!("consumers::post (method at tests/consumers.rs:{POST_LINE})")
            ),
            ("switched", "inbox_test_refunds::switched_claim"),
            ("switched-batch", "inbox_test_refunds::switched_batch_claim"),
            ("switched-read", "inbox_test_refunds::switched_read_claim"),
        ]
    );
}

#[test]
fn a_consumer_shared_across_crates_is_reported() {
    let shared = check_consumers().expect_err("\"credit\" is used twice");
    assert_eq!(
        shared.iter().collect::<Vec<_>>(),
        [(
            "credit",
            &["consumers::credit", "inbox_test_refunds::refund"][..]
        )]
    );
    assert!(
        shared
            .to_string()
            .contains("\"credit\" is used by consumers::credit and inbox_test_refunds::refund"),
        "{shared}"
    );
}

/// Calling the other crate's handler is what links it, as in a real consumer service.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn the_other_crates_handler_runs() {
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    let mut conn = SyncConnectionWrapper::<diesel::sqlite::SqliteConnection>::establish(":memory:")
        .await
        .unwrap();
    diesel_inbox::migrate(&mut conn).await.unwrap();
    let outcome = inbox_test_refunds::refund(&mut conn, 7).await.unwrap();
    assert_eq!(outcome, diesel_inbox::Outcome::Processed(()));
}
