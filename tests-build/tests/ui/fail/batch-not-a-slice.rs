use std::collections::HashSet;

use diesel_async::AsyncPgConnection;

struct Msg {
    id: u64,
}

#[diesel_inbox::idempotent(consumer = "c", batch = msg, key = |msg| msg.id)]
async fn one(conn: &mut AsyncPgConnection, msg: &Msg) -> Result<(), diesel::result::Error> {
    let _ = (conn, msg);
    Ok(())
}

#[diesel_inbox::idempotent(consumer = "d", batch = ids, key = |id| *id)]
async fn set(conn: &mut AsyncPgConnection, ids: HashSet<u64>) -> Result<(), diesel::result::Error> {
    let _ = (conn, ids);
    Ok(())
}

fn main() {}
