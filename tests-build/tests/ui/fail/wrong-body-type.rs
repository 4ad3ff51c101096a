use diesel::result::Error;
use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<u64, Error> {
    let _ = conn;
    if id == 0 {
        return Ok("zero");
    }
    Ok(id.to_string())
}

fn main() {}
