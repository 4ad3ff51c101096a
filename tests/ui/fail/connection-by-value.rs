use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::Object;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(mut conn: Object<AsyncPgConnection>, id: u64) -> Result<(), diesel::result::Error> {
    let _ = &mut conn;
    Ok(())
}

fn main() {}
