use diesel_async::AsyncPgConnection;

/// Named like a `Result` alias, but not one.
type LookupResult<T> = Option<T>;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> LookupResult<u64> {
    let _ = conn;
    Some(id)
}

fn main() {}
