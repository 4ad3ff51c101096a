use diesel::SqliteConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(conn: &mut SqliteConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
