use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id, claim = true, max_attempts = 0)]
async fn flag_with_value(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

#[diesel_inbox::idempotent(consumer = "d", key = id, claim, fast_path = true, max_attempts = n)]
async fn fast_path_in_claim_mode(
    conn: &mut AsyncPgConnection,
    id: u64,
    n: u32,
) -> Result<(), diesel::result::Error> {
    let _ = (conn, id, n);
    Ok(())
}

#[diesel_inbox::idempotent(consumer = "e", key)]
async fn key_without_value(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
