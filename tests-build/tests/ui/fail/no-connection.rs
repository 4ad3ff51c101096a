use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(pool: &AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (pool, id);
    Ok(())
}

fn main() {}
