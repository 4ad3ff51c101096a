use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

#[idempotent(consumer = "credit", key = id)]
#[diesel_inbox::idempotent(consumer = "credit-again", key = id)]
async fn credit(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
