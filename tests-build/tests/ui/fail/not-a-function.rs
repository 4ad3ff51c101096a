#[diesel_inbox::idempotent(consumer = "c", key = id)]
struct Handler;

fn main() {}
