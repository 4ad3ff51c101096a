//! A crate that forbids every warning compiles every handler shape: the expansion writes
//! no `allow` that a `forbid` would overrule (E0453, or for a lint that `forbid(warnings)`
//! covers, the future-incompatibility lint `forbidden_lint_groups`), nor does any macro it
//! calls, and the consumer's claim is no non-local `#[macro_export]`. trybuild passes a
//! case that only warns, so `future_incompatible`, which holds `forbidden_lint_groups`,
//! is forbidden too: such an `allow` then fails the case. `unsafe_code` holds as well:
//! the registration's `link_section` is the expansion's, not the crate's.
#![forbid(warnings)]
#![forbid(non_local_definitions, async_fn_in_trait, unused, future_incompatible, unsafe_code)]

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::{Claim, Outcome, idempotent};

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "forbid-free", key = msg.id)]
pub async fn free(conn: &mut AsyncPgConnection, msg: &Msg) -> Result<(), Error> {
    let _ = conn;
    Ok(())
}

pub struct Projector;

impl Projector {
    #[idempotent(consumer = "forbid-method", key = msg.id)]
    pub async fn method(&self, conn: &mut AsyncPgConnection, msg: &Msg) -> Result<(), Error> {
        let _ = conn;
        Ok(())
    }

    #[idempotent(consumer = "forbid-associated", key = id)]
    pub async fn associated(conn: &mut AsyncPgConnection, id: u64) -> Result<(), Error> {
        let _ = conn;
        Ok(())
    }
}

pub trait Handler {
    fn handle(
        &self,
        conn: &mut AsyncPgConnection,
        msg: &Msg,
    ) -> impl Future<Output = Result<Outcome<()>, Error>> + Send;
}

impl Handler for Projector {
    #[idempotent(consumer = "forbid-trait-impl", key = msg.id)]
    async fn handle(&self, conn: &mut AsyncPgConnection, msg: &Msg) -> Result<(), Error> {
        let _ = conn;
        Ok(())
    }
}

#[idempotent(consumer = "forbid-batch", batch = msgs, key = |msg| msg.id)]
pub async fn batch(conn: &mut AsyncPgConnection, msgs: &[Msg]) -> Result<usize, Error> {
    let _ = conn;
    Ok(msgs.len())
}

/// The body leaves the connection alone, as most claim-mode bodies do.
#[idempotent(consumer = "forbid-claim", key = msg.id, claim)]
pub async fn claim(conn: &mut AsyncPgConnection, msg: &Msg) -> Result<u32, Error> {
    Ok(Claim::current().attempt())
}

fn main() {}
