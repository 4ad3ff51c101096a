use diesel_async::AsyncPgConnection;

struct Repo<'c> {
    conn: &'c mut AsyncPgConnection,
}

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle<'c>(conn: &'c mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let repo: Repo<'c> = Repo { conn };
    let _ = repo.conn;
    Ok(())
}

fn main() {}
