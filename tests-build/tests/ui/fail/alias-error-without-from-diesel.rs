use diesel_async::AsyncPgConnection;

#[derive(Debug)]
struct AppError;

type AppResult<T> = Result<T, AppError>;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> AppResult<u64> {
    let _ = conn;
    Ok(id)
}

fn main() {}
