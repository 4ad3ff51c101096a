use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
