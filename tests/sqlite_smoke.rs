#![cfg(feature = "sqlite")]
use diesel::prelude::*;
use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::{Outcome, idempotent};

type Conn = SyncConnectionWrapper<SqliteConnection>;

struct Msg {
    id: String,
    amount: i64,
}

#[idempotent(consumer = "credit", key = msg.id)]
async fn credit(conn: &mut Conn, msg: &Msg) -> Result<i64, diesel::result::Error> {
    conn.batch_execute(&format!(
        "UPDATE accounts SET balance = balance + {}",
        msg.amount
    ))
    .await?;
    Ok(msg.amount)
}

#[tokio::test]
async fn smoke() {
    let mut conn = Conn::establish(":memory:").await.unwrap();
    diesel_inbox::migrate(&mut conn).await.unwrap();
    conn.batch_execute(
        "CREATE TABLE accounts (balance BIGINT NOT NULL); INSERT INTO accounts VALUES (0);",
    )
    .await
    .unwrap();
    let msg = Msg {
        id: "m1".into(),
        amount: 5,
    };
    assert_eq!(
        credit(&mut conn, &msg).await.unwrap(),
        Outcome::Processed(5)
    );
    assert_eq!(credit(&mut conn, &msg).await.unwrap(), Outcome::Duplicate);
    let n: i64 = diesel::dsl::sql::<diesel::sql_types::BigInt>("SELECT balance FROM accounts")
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 5);
}
