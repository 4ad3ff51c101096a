//! A crate that forbids every warning compiles every handler shape: the expansion writes
//! no `allow` that a `forbid` would overrule (E0453), and the consumer's claim is no
//! non-local `#[macro_export]`. `unsafe_code` holds as well: the registration's
//! `link_section` is inventory's, not the crate's. `future_incompatible` is not forbidden
//! here: the registration's `inventory::submit!` writes `#[allow(non_upper_case_globals)]`,
//! which `forbid(warnings)` reports as the warning `forbidden_lint_groups` (documented);
//! it is allowed here so that the workspace's builds stay quiet.
#![forbid(warnings)]
#![allow(forbidden_lint_groups)]
#![forbid(non_local_definitions, async_fn_in_trait, unused, unsafe_code)]

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
