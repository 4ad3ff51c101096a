use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id, claim, lease = 30)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
