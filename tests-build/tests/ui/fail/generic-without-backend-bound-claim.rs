use diesel_async::AsyncConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id, claim)]
async fn handle<C: AsyncConnection>(conn: &mut C, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
