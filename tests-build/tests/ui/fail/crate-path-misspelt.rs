use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id, crate = ::diesel_inboxx)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
