use diesel_async::AsyncConnection;

#[diesel_inbox::idempotent(consumer = "c", batch = ids, key = |id| *id)]
async fn handle<C: AsyncConnection>(conn: &mut C, ids: &[u64]) -> Result<(), diesel::result::Error> {
    let _ = (conn, ids);
    Ok(())
}

fn main() {}
