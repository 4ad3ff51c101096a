use std::collections::VecDeque;

use diesel_async::AsyncPgConnection;

struct Msg {
    id: u64,
}

#[diesel_inbox::idempotent(consumer = "c", batch = msgs, key = |msg| msg.id)]
async fn boxed_deque(conn: &mut AsyncPgConnection, msgs: Box<VecDeque<Msg>>) -> Result<(), diesel::result::Error> {
    let _ = (conn, msgs);
    Ok(())
}

fn main() {}
