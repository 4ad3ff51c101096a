//! A mistake in the arguments is reported alone: the parameters that only `key` and
//! `fast_path` use are not reported unused as well.
use diesel_async::AsyncPgConnection;

pub struct Msg {
    pub id: u64,
}

#[diesel_inbox::idempotent(consumer = "c", key = msg.id, fast_path = redelivered, retries = 3)]
pub async fn handle(
    conn: &mut AsyncPgConnection,
    msg: &Msg,
    redelivered: bool,
) -> Result<(), diesel::result::Error> {
    let _ = conn;
    Ok(())
}

fn main() {}
