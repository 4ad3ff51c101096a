use diesel_async::AsyncPgConnection;

#[derive(Debug)]
struct AppError;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), AppError> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
