//! Claim mode: the body reads its claim through `Claim::current()` and hands the
//! downstream system the idempotency key; handlers on every backend can be spawned.
#![deny(warnings)]

use std::time::Duration;

use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};
use diesel_inbox::{Claim, Outcome, idempotent};

struct OrderPlaced {
    order_id: u64,
    email: String,
    raw: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
    #[error("the mail provider refused: {0}")]
    Mail(String),
}

/// Stands in for an e-mail provider's client.
async fn send_mail(to: &str, idempotency_key: &str, attempt: u32) -> Result<(), AppError> {
    if to.is_empty() || idempotency_key.is_empty() || attempt == 0 {
        return Err(AppError::Mail(String::from("rejected")));
    }
    Ok(())
}

#[idempotent(consumer = "receipt-email", key = msg.order_id, claim, fingerprint = &msg.raw)]
async fn send_receipt(conn: &mut AsyncPgConnection, msg: &OrderPlaced) -> Result<u32, AppError> {
    let claim = Claim::current();
    let key = claim.idempotency_key().to_string();
    send_mail(&msg.email, &key, claim.attempt()).await?;
    Ok(claim.attempt())
}

#[idempotent(
    consumer = "withdrawal",
    key = msg.order_id,
    claim,
    lease = Duration::from_secs(30),
    max_attempts = 3,
    takeover = false
)]
async fn withdraw(conn: &mut AsyncMysqlConnection, msg: &OrderPlaced) -> Result<(), AppError> {
    let claim = Claim::current();
    send_mail(
        claim.message_id(),
        &claim.token().to_string(),
        claim.attempt(),
    )
    .await?;
    Ok(())
}

#[idempotent(consumer = "sqlite-receipt", key = msg.order_id, claim, lease = lease)]
async fn sqlite_receipt(
    conn: &mut SyncConnectionWrapper<SqliteConnection>,
    msg: &OrderPlaced,
    lease: Duration,
) -> Result<(), AppError> {
    let _ = Claim::try_current().map(|claim| claim.consumer());
    send_mail(&msg.email, "key", 1).await
}

fn spawn_all(
    mut pg: AsyncPgConnection,
    mut mysql: AsyncMysqlConnection,
    mut sqlite: SyncConnectionWrapper<SqliteConnection>,
) {
    let msg = || OrderPlaced {
        order_id: 7,
        email: String::from("a@example.com"),
        raw: b"{}".to_vec(),
    };
    tokio::spawn(async move {
        let outcome: Outcome<u32> = send_receipt(&mut pg, &msg()).await?;
        match outcome {
            Outcome::Processed(_) | Outcome::Duplicate => {}
            Outcome::InProgress { lease_remaining } => {
                let _ = lease_remaining;
            }
        }
        Ok::<_, AppError>(())
    });
    tokio::spawn(async move { withdraw(&mut mysql, &msg()).await });
    tokio::spawn(async move { sqlite_receipt(&mut sqlite, &msg(), Duration::from_secs(5)).await });
}

fn main() {
    let _ = spawn_all;
}
