use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64, name: Option<&str>) -> Result<usize, diesel::result::Error> {
    let _ = conn;
    let name = name?;
    Ok(name.len())
}

fn main() {}
