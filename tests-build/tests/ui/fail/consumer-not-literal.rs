use diesel_async::AsyncPgConnection;

const CONSUMER: &str = "credit";

#[diesel_inbox::idempotent(consumer = CONSUMER, key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
