use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(
    primary: &mut AsyncPgConnection,
    replica: &mut AsyncPgConnection,
    id: u64,
) -> Result<(), diesel::result::Error> {
    let _ = (primary, replica, id);
    Ok(())
}

fn main() {}
