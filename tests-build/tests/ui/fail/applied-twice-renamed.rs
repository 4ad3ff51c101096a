use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent as exactly_once;

#[exactly_once(consumer = "credit", key = id)]
#[exactly_once(consumer = "credit-again", key = id)]
async fn credit(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
