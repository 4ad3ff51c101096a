//! MySQL and MariaDB: the upgrade of a full 0.2 inbox by a copy of it, which handlers
//! never wait behind for more than a second.
//!
//! An online `ALTER TABLE` of the inbox would build the digest's index while inserts go
//! on, but at its end InnoDB applies the inserts made meanwhile to the new index while
//! every insert into the table waits: a page read per insert on an inbox whose index
//! outgrows the buffer pool (handlers stalled 4.5 s at 10 million markers with the
//! default 128 MiB pool). Instead:
//!
//! 1. Triggers on the inbox record the id of every row written from then on.
//! 2. The markers are copied, in the order of their ids, into a table of the same
//!    columns without the unique index, which is then built in bulk on the copy, where
//!    no handler writes.
//! 3. The triggers are replaced, one at a time, by triggers that repeat each write into
//!    the copy itself; then the recorded rows are copied again, as the inbox holds them,
//!    in transactions that lock them in the inbox first, as a write does.
//! 4. One `RENAME TABLE` puts the copy in the inbox's place.
//!
//! Every statement that waits for the inbox's metadata lock (each trigger, the rename)
//! does so for a second at most, and is tried again. A transaction that writes the inbox
//! holds that lock until it ends, so a trigger is in place once no transaction without
//! it is open: every write is in the inbox before the copy reads it, or recorded, or
//! repeated in the copy.
//!
//! MariaDB only (`CREATE OR REPLACE TRIGGER`); MySQL and Galera nodes take the `ALTER`.

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::result::Error;
use diesel::sql_types::{Nullable, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::ddl::{LOCK_ATTEMPTS, number, with_short_lock_waits};
use crate::schema::INDEX_NAME;

/// The copy of the inbox that takes the inbox's name.
const COPY: &str = "diesel_inbox_upgrading";

/// The ids of the rows written since the triggers were created, to copy again.
const CHANGED: &str = "diesel_inbox_changed";

/// 0.2's inbox once the copy took its name, until it is dropped.
const RETIRED: &str = "diesel_inbox_retired";

/// The writes the triggers follow.
const WRITES: [&str; 3] = ["INSERT", "UPDATE", "DELETE"];

/// The trigger that follows a `write`: first the one that records the rows it changes,
/// then, under the same name, the one that repeats it into the copy. Replaced in one
/// statement rather than joined by a second trigger: MariaDB 10.11 does not prepare
/// again a statement prepared before a second trigger for the same write was added, and
/// that statement then finds the second trigger's table missing.
fn trigger(write: &str) -> String {
    format!("diesel_inbox_upgrade_{}", write.to_lowercase())
}

/// Markers copied per statement in id order: no handler waits for these.
const BULK_CHUNK: i64 = 20_000;

/// Changed rows copied again per transaction, which holds shared locks on them.
const CHANGED_CHUNK: i64 = 1_000;

/// Replaces 0.2's inbox by a copy with the digest's unique index, while handlers run.
/// The caller holds the upgrade's lock, and found the index not yet on the digest.
pub(super) async fn rebuild<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    // What a call cut short left may have missed writes: start again.
    start_over(conn).await?;
    let copied = copy_and_swap(conn).await;
    if copied.is_err() {
        // The inbox is still 0.2's: let handlers stop writing twice.
        let _explained_by_copied = start_over(conn).await;
    }
    copied?;
    drop_leftovers(conn).await
}

async fn copy_and_swap<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    conn.batch_execute(&format!(
        "CREATE TABLE {COPY} LIKE inbox; \
         ALTER TABLE {COPY} DROP INDEX {INDEX_NAME}; \
         CREATE TABLE {CHANGED} (id BIGINT NOT NULL PRIMARY KEY) ENGINE = InnoDB"
    ))
    .await?;
    let columns = stored_columns(conn).await?;
    for write in WRITES {
        let row = if write == "DELETE" { "OLD" } else { "NEW" };
        let record = format!(
            "CREATE TRIGGER {} AFTER {write} ON inbox FOR EACH ROW \
             INSERT IGNORE INTO {CHANGED} (id) VALUES ({row}.id)",
            trigger(write),
        );
        with_short_lock_waits(conn, &record).await?;
    }
    // Rows written from here on are recorded; those before are copied now.
    let last = number(conn, "SELECT MAX(id) AS value FROM inbox")
        .await?
        .unwrap_or(0);
    let list = columns.join(", ");
    let mut first = 1;
    while first <= last {
        let end = first.saturating_add(BULK_CHUNK - 1).min(last);
        // A consistent read, which locks nothing at `READ COMMITTED`: a row written
        // meanwhile is recorded, and copied again.
        conn.batch_execute(&format!(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
             INSERT INTO {COPY} ({list}) SELECT {list} FROM inbox \
             WHERE id BETWEEN {first} AND {end}"
        ))
        .await?;
        first = end + 1;
    }
    // In bulk, where no handler writes: a stall at its end holds up nobody.
    conn.batch_execute(&format!(
        "ALTER TABLE {COPY} ADD UNIQUE INDEX {INDEX_NAME} (key_digest), \
         ALGORITHM = INPLACE, LOCK = NONE"
    ))
    .await?;
    // Each write reaches the copy itself from here on.
    for statement in repeating_triggers(&columns) {
        with_short_lock_waits(conn, &statement).await?;
    }
    // No write is recorded now: copy again what was.
    while copy_changed(conn, &list).await? {}
    with_short_lock_waits(
        conn,
        &format!("RENAME TABLE inbox TO {RETIRED}, {COPY} TO inbox"),
    )
    .await
}

/// The inbox's columns, quoted, but the generated digest, which the copy computes.
async fn stored_columns<C>(conn: &mut C) -> QueryResult<Vec<String>>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let listed = diesel::sql_query(
        "SELECT GROUP_CONCAT(column_name ORDER BY ordinal_position SEPARATOR ',') AS value \
         FROM information_schema.columns WHERE table_schema = DATABASE() \
         AND table_name = 'inbox' AND extra NOT LIKE '%GENERATED%'",
    )
    .get_result::<Words>(conn)
    .await?
    .value
    .unwrap_or_default();
    Ok(listed
        .split(',')
        .map(|column| format!("`{column}`"))
        .collect())
}

/// The triggers that repeat each insert, update and delete on the inbox into the copy,
/// each replacing the recording one at once.
fn repeating_triggers(columns: &[String]) -> Vec<String> {
    let list = columns.join(", ");
    let values: Vec<String> = columns
        .iter()
        .map(|column| format!("NEW.{column}"))
        .collect();
    let assignments: Vec<String> = columns
        .iter()
        .map(|column| format!("{column} = NEW.{column}"))
        .collect();
    WRITES
        .iter()
        .map(|write| {
            let action = match *write {
                "INSERT" => format!("INSERT INTO {COPY} ({list}) VALUES ({})", values.join(", ")),
                "UPDATE" => format!(
                    "UPDATE {COPY} SET {} WHERE id = OLD.id",
                    assignments.join(", ")
                ),
                _ => format!("DELETE FROM {COPY} WHERE id = OLD.id"),
            };
            let name = trigger(write);
            format!("CREATE OR REPLACE TRIGGER {name} AFTER {write} ON inbox FOR EACH ROW {action}")
        })
        .collect()
}

/// Copies again some of the recorded rows, as the inbox holds them now, in a
/// transaction that first takes shared locks on them in the inbox, as a write locks the
/// inbox's row before its trigger writes the copy's: a write of one waits for the
/// transaction, and its trigger then finds the row copied, or the transaction waits for
/// the write. Whether any was left.
async fn copy_changed<C>(conn: &mut C, columns: &str) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let pick = format!(
        "SELECT MIN(id) AS value FROM (SELECT id FROM {CHANGED} ORDER BY id LIMIT {CHANGED_CHUNK}) AS next"
    );
    let Some(first) = number(conn, &pick).await? else {
        return Ok(false);
    };
    let last = format!(
        "SELECT MAX(id) AS value FROM (SELECT id FROM {CHANGED} ORDER BY id LIMIT {CHANGED_CHUNK}) AS next"
    );
    let last = number(conn, &last).await?.unwrap_or(first);
    // Joins from the recorded ids, which MariaDB runs as lookups by id; a subquery in a
    // single-table `DELETE` would scan the copy.
    let changed = format!(
        "{CHANGED} AS changed JOIN inbox ON inbox.id = changed.id \
         WHERE changed.id BETWEEN {first} AND {last}"
    );
    let copied_columns: Vec<String> = columns
        .split(", ")
        .map(|column| format!("inbox.{column}"))
        .collect();
    let copied_columns = copied_columns.join(", ");
    let copy = format!(
        "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION; \
         SELECT COUNT(*) INTO @diesel_inbox_locked FROM {changed} LOCK IN SHARE MODE; \
         DELETE copy FROM {CHANGED} AS changed JOIN {COPY} AS copy ON copy.id = changed.id \
         WHERE changed.id BETWEEN {first} AND {last}; \
         INSERT INTO {COPY} ({columns}) SELECT {copied_columns} FROM {changed}; \
         DELETE FROM {CHANGED} WHERE id BETWEEN {first} AND {last}; \
         COMMIT"
    );
    let mut attempt = 1;
    loop {
        match conn.batch_execute(&copy).await {
            Ok(()) => return Ok(true),
            Err(error) => {
                let _explained_by_error = conn.batch_execute("ROLLBACK").await;
                let again = matches!(&error, Error::DatabaseError(_, info)
                    if super::is_transient(info.message()));
                if !again || attempt == LOCK_ATTEMPTS {
                    return Err(error);
                }
            }
        }
        attempt += 1;
    }
}

/// Drops the triggers and the tables a previous call may have left.
async fn start_over<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    for write in WRITES {
        let drop = format!("DROP TRIGGER IF EXISTS {}", trigger(write));
        with_short_lock_waits(conn, &drop).await?;
    }
    conn.batch_execute(&format!("DROP TABLE IF EXISTS {COPY}, {CHANGED}"))
        .await
}

/// Drops 0.2's inbox, with its triggers, and the record of changed rows, once the copy
/// has the inbox's name (by a call cut short after the rename, too).
pub(super) async fn drop_leftovers<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    conn.batch_execute(&format!("DROP TABLE IF EXISTS {RETIRED}, {CHANGED}"))
        .await
}

/// A text a query selects as `value`.
#[derive(diesel::QueryableByName)]
struct Words {
    #[diesel(sql_type = Nullable<Text>)]
    value: Option<String>,
}

/// Whether the upgrade is an `ALTER` here rather than a copy: on MySQL, which cannot
/// replace a trigger in one statement, and on a node of a Galera cluster, where a copy's
/// shared locks hold only on its own node, which certifies writes alone, so a claim
/// updated on another node meanwhile could be copied as it was.
pub(super) async fn takes_the_alter<C>(conn: &mut C) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = Mysql>,
{
    // 1 on MySQL, which skips the MariaDB-only comment; on MariaDB `wsrep_on`, 1 on a
    // Galera node and 0 on a server of its own.
    match number(conn, "SELECT 1 /*M! - 1 + @@wsrep_on */ AS value").await {
        Ok(alter) => Ok(alter != Some(0)),
        Err(Error::DatabaseError(..)) => Ok(true),
        Err(error) => Err(error),
    }
}
