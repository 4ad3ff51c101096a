//! The credit workload: messages that each add an amount to one account's balance, the
//! tables they write, and the reads that check every credit was applied once.
//!
//! The schema is one SQL text that PostgreSQL, MySQL/MariaDB and SQLite all accept, and
//! every statement is generic over the connection: nothing here depends on a backend.

use std::future::Future;

use diesel::QueryResult;
use diesel::dsl::update;
use diesel::prelude::*;
use diesel_async::methods::LoadQuery;
use diesel_async::{AsyncConnection, RunQueryDsl};

diesel::table! {
    /// The business table: one balance per account, ids `0..n`.
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

diesel::table! {
    /// The naive handler's record of seen messages: what people write before an inbox.
    /// It has a plain index, so that its look-up costs what the inbox's does, and no
    /// unique one: that is the naive handler's mistake, and what lets two copies of a
    /// message both be applied. (diesel needs a key to name.)
    naive_inbox (message_id, consumer) {
        message_id -> Text,
        consumer -> Text,
    }
}

/// Creates [`accounts`] and [`naive_inbox`], beside the inbox.
pub const CREATE_TABLES: &str = "
    CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
    CREATE TABLE naive_inbox (message_id VARCHAR(255) NOT NULL, consumer VARCHAR(200) NOT NULL);
    CREATE INDEX ix_naive_inbox ON naive_inbox (message_id, consumer);
";

/// Accounts opened per statement: a bulk load, in statements of a size every backend takes.
const ACCOUNTS_PER_INSERT: i64 = 1_000;

/// One credit message: add `amount` to account `account`, once, however often the
/// message with `message_id` is delivered. `Id` is the key's type: a `String`, or a
/// `uuid::Uuid` where the ids are UUIDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Credit<Id = String> {
    pub message_id: Id,
    pub account: i64,
    pub amount: i64,
}

impl Credit {
    /// Message `n` of a test: `msg-<n>`, crediting 1 to account `n`.
    pub fn numbered(n: i64) -> Self {
        Self {
            message_id: format!("msg-{n}"),
            account: n,
            amount: 1,
        }
    }

    /// The message `message_id`, crediting 1 to `account`.
    pub fn of(message_id: &str, account: i64) -> Self {
        Self {
            message_id: message_id.to_owned(),
            account,
            amount: 1,
        }
    }

    /// Reads a message from its id and its [`Credit::payload`].
    pub fn parse(message_id: &str, payload: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(payload).ok()?;
        let (account, amount) = text.split_once(' ')?;
        Some(Self {
            message_id: message_id.to_owned(),
            account: account.parse().ok()?,
            amount: amount.parse().ok()?,
        })
    }
}

impl<Id> Credit<Id> {
    /// The body a broker or a downstream service carries: `"<account> <amount>"`. The id
    /// travels beside it, as a broker's message id does.
    pub fn payload(&self) -> Vec<u8> {
        format!("{} {}", self.account, self.amount).into_bytes()
    }
}

/// `UPDATE accounts SET balance = balance + $1 WHERE id = $2`: the business write.
#[diesel::dsl::auto_type]
pub fn credit_account(account: i64, amount: i64) -> _ {
    update(accounts::table.find(account)).set(accounts::balance.eq(accounts::balance + amount))
}

#[diesel::dsl::auto_type]
fn balances_by_account() -> _ {
    accounts::table
        .order(accounts::id)
        .select(accounts::balance)
}

/// The credit workload's tables on a connection of any backend. The blanket impl states
/// diesel's bounds once.
pub trait CreditTables: AsyncConnection {
    /// Creates the tables (see [`CREATE_TABLES`]) and opens accounts `0..accounts`, each
    /// with a balance of 0.
    fn create_credit_tables(
        &mut self,
        accounts: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Every account's balance, in the order of their ids: the balance of account `n` is
    /// at index `n`.
    fn balances(&mut self) -> impl Future<Output = QueryResult<Vec<i64>>> + Send;
}

impl<C> CreditTables for C
where
    C: AsyncConnection + 'static,
    balances_by_account: LoadQuery<'static, C, i64> + Send + 'static,
{
    async fn create_credit_tables(&mut self, accounts: i64) -> QueryResult<()> {
        self.batch_execute(CREATE_TABLES).await?;
        for start in (0..accounts).step_by(ACCOUNTS_PER_INSERT as usize) {
            let end = (start + ACCOUNTS_PER_INSERT).min(accounts);
            let rows: Vec<String> = (start..end).map(|id| format!("({id}, 0)")).collect();
            self.batch_execute(&format!(
                "INSERT INTO accounts (id, balance) VALUES {}",
                rows.join(", ")
            ))
            .await?;
        }
        Ok(())
    }

    fn balances(&mut self) -> impl Future<Output = QueryResult<Vec<i64>>> + Send {
        balances_by_account().load(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_reads_back_as_the_credit_it_carries() {
        let credit = Credit {
            message_id: "m-1".to_owned(),
            account: 7,
            amount: -30,
        };
        assert_eq!(Credit::parse("m-1", &credit.payload()), Some(credit));
        assert_eq!(Credit::parse("m-1", b"7"), None);
        assert_eq!(Credit::parse("m-1", b"seven 30"), None);
    }
}
