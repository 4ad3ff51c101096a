//! PostgreSQL: what `migrate` finds already there, read from the catalog without a lock.
//!
//! `CREATE … IF NOT EXISTS` locks before it looks: `CREATE INDEX` takes a SHARE lock on
//! its table, which waits for every open transaction on it and holds up every insert
//! behind it, and which meets `upgrade_unique_index`'s concurrent build in a deadlock;
//! and either needs the right to create, which an application's role may lack. So each
//! `migrate` sends its DDL only where something is missing.

use diesel::QueryResult;
use diesel::sql_types::Bool;
use diesel_async::{AsyncConnection, RunQueryDsl};

/// Whether `condition`, an SQL expression over the catalog, holds.
pub(super) async fn holds<C>(conn: &mut C, condition: &str) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    diesel::select(diesel::dsl::sql::<Bool>(condition))
        .get_result(conn)
        .await
}

/// The condition that the `search_path` finds `table`, as the statements on it do.
pub(super) fn table(table: &str) -> String {
    format!("pg_catalog.to_regclass('{table}') IS NOT NULL")
}

/// The condition that `table` has an index named `index`.
pub(super) fn index_on(table: &str, index: &str) -> String {
    format!(
        "EXISTS (SELECT FROM pg_catalog.pg_index AS i \
         JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid \
         WHERE i.indrelid = pg_catalog.to_regclass('{table}') AND c.relname = '{index}')"
    )
}
