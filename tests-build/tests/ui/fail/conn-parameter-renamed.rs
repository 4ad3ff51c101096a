use diesel_async::AsyncPgConnection;

// rustc's advice for an unused connection is `_db`; `conn` must then follow it.
#[diesel_inbox::idempotent(consumer = "c", key = id, claim, conn = db)]
async fn handle(_db: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
