use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::Object;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn pooled(mut conn: Object<AsyncPgConnection>, id: u64) -> Result<(), diesel::result::Error> {
    let _ = &mut conn;
    Ok(())
}

#[diesel_inbox::idempotent(consumer = "d", key = id)]
async fn owned(conn: AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = conn;
    Ok(())
}

#[diesel_inbox::idempotent(consumer = "e", key = id)]
async fn opaque(conn: impl diesel_async::AsyncConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = conn;
    Ok(())
}

fn main() {}
