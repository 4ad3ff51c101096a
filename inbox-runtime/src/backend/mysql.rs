//! MySQL and MariaDB.
//!
//! The marker is a plain `INSERT`: a duplicate raises 1062, which rolls back only that
//! statement. diesel's `on_conflict_do_nothing` cannot be used: on MySQL it becomes
//! `ON DUPLICATE KEY UPDATE id = id`, which reports one affected row for a new row and for
//! a duplicate alike under diesel-async's `CLIENT_FOUND_ROWS`. `INSERT IGNORE` would also
//! hide truncation and conversion errors.

use diesel::result::DatabaseErrorInformation;

use crate::schema::INDEX_NAME;

/// Whether a unique violation names the inbox's index. The server's message is
/// translated into the session's `lc_messages`, but every translation quotes the
/// duplicate value first and the key's name last: MariaDB as `'ux_inbox_message_consumer'`,
/// MySQL 8.0.19+ as `'inbox.ux_inbox_message_consumer'`. Only that last quoted name is
/// read: the value before it is the caller's data.
pub(crate) fn names_inbox_index(info: &dyn DatabaseErrorInformation) -> bool {
    let Some((quoted, _after)) = info.message().rsplit_once('\'') else {
        return false;
    };
    let Some((_before, key)) = quoted.rsplit_once('\'') else {
        return false;
    };
    key.strip_prefix("inbox.").unwrap_or(key) == INDEX_NAME
}

/// 1213 deadlock, 1205 lock wait timeout, 1317 query interrupted (`KILL QUERY`) and
/// 1969 statement timeout (`max_statement_time`), which diesel-async reports as `Unknown`
/// with only the message, as MariaDB words it in each `lc_messages` language. A waiting
/// marker insert ends in these by design, and so does a body's statement that lost a
/// race for a lock: the delivery must be retried, never dead-lettered.
const RETRYABLE_SERVER_MESSAGES: &[&str] = &[
    // 1205, lock wait timeout
    "Lock wait timeout exceeded; try restarting transaction",
    "锁等待超时;尝试重新启动事务",
    "Lock wait timeout overskredet",
    "Kontrollaeg ületatud luku järel ootamisel; Proovi transaktsiooni otsast alata",
    "Timeout sur l'obtention du verrou",
    "Beim Warten auf eine Sperre wurde die zulässige Wartezeit überschritten",
    "ბლოკის მოლოდინის ვადა ამოიწურა",
    "E' scaduto il timeout per l'attesa del lock",
    "ロック待ちがタイムアウトしました。",
    "Lock wacht tijd overschreden",
    "Tempo de espera (timeout) de travamento excedido",
    "Таймаут ожидания блокировки истек",
    "Vremenski limit za zaključavanje tabele je istekao",
    "Tiempo de espera de bloqueo excedido",
    "Fick inte ett lås i tid",
    "Затримку очікування блокування вичерпано",
    // 1213, deadlock
    "Deadlock found when trying to get lock; try restarting transaction",
    "试图锁定时发现僵局",
    "Lukustamisel tekkis tupik (deadlock)",
    "Deadlock découvert en essayant d'obtenir les verrous",
    "Beim Versuch, eine Sperre anzufordern, ist ein Deadlock aufgetreten",
    "ჩიხი ბლოკის მიღების მცდელობისას",
    "Trovato deadlock durante il lock",
    "ロック取得中にデッドロックが検出されました。",
    "Deadlock gevonden tijdens lock-aanvraag poging",
    "Encontrado um travamento fatal (deadlock)",
    "Возникла тупиковая ситуация в процессе получения блокировки",
    "Unakrsno zaključavanje pronađeno",
    "Encontrado estancamiento (deadlock)",
    "Fick 'DEADLOCK' vid låsförsök",
    "Взаємне блокування знайдено",
    // 1317, query interrupted; 1969, statement timeout (same opening where translated)
    "Query execution was interrupted",
    "查询执行中断",
    "Ausführung der Abfrage wurde unterbrochen",
    "მოთხოვნის შესრულება შეწყვეტილია",
    "Se ha interrumpido la ejecución de la consulta",
    "Se ha interrumpido la ejecución de una consulta",
];

/// 1305 for one of diesel's savepoints: InnoDB rolled back the whole transaction under a
/// nested `conn.transaction` (a deadlock does this), so the `ROLLBACK TO SAVEPOINT` that
/// followed found nothing, and its error replaced the deadlock's. Every translation
/// opens with the object's kind and name (`%s %s`, in Chinese `%s%s`).
fn is_lost_diesel_savepoint(message: &str) -> bool {
    message
        .strip_prefix("SAVEPOINT")
        .is_some_and(|rest| rest.trim_start().starts_with("diesel_savepoint_"))
}

/// Whether a MySQL/MariaDB error that diesel-async reports as `Unknown` is worth a
/// retry: lock conflicts and interrupted waits in any server language, and a
/// transaction rolled back under a nested savepoint.
pub(crate) fn is_transient(message: &str) -> bool {
    RETRYABLE_SERVER_MESSAGES
        .iter()
        .any(|text| message.starts_with(text))
        || is_lost_diesel_savepoint(message)
}

/// The driver's texts for a connection that is gone, and Galera's 1047 from a node that
/// has left the cluster's primary component (reconnect to another node).
pub(crate) fn is_connection_lost(message: &str) -> bool {
    [
        "WSREP has not yet prepared node for application use",
        "Input/output error",
        "Lost connection to",
        "server has gone away",
        "Connection was killed",
        "Connection to the server is closed",
    ]
    .iter()
    .any(|pattern| message.contains(pattern))
}

/// Puts autocommit back as the marker insert, or a claim, found it: both keep the
/// session's setting in `@diesel_inbox_autocommit`. Run only outside a transaction:
/// turning autocommit on commits an open one.
#[cfg(feature = "mysql")]
macro_rules! restore_autocommit {
    () => {
        "SET autocommit = COALESCE(@diesel_inbox_autocommit, @@autocommit), \
         @diesel_inbox_autocommit = NULL"
    };
}

/// [`restore_autocommit!`] as a statement of its own.
#[cfg(feature = "mysql")]
pub(crate) const RESTORE_AUTOCOMMIT: &str = restore_autocommit!();

#[cfg(feature = "mysql")]
mod imp {
    use std::future::Future;

    use diesel::OptionalExtension as _;
    use diesel::QueryResult;
    use diesel::mysql::Mysql;
    use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
    use diesel::result::{DatabaseErrorKind, Error};
    use diesel::sql_types::{BigInt, Bool, Text};
    use diesel_async::{AsyncConnection, RunQueryDsl};

    use super::super::queries::{
        InsertMarkers, MARKERS_PER_STATEMENT, chunks, fingerprinted_insert, hex_digits,
        plain_insert,
    };
    use super::super::savepoint::{self, SavepointBackend, lost_marker, savepoint};
    use super::super::sealed::{self, Marker, PruneBounds};
    use super::super::{end_unless_inserted, enter_transaction};
    use crate::schema::INDEX_NAME;

    /// Right after the marker insert, in one round trip: records the new marker's id for
    /// [`SavepointBackend::own_marker_committed`] (a session variable outlives the
    /// transaction, and `LAST_INSERT_ID()` changes with the body's own inserts), turns
    /// autocommit off until the transaction is over, and sets the savepoint that the
    /// commit releases.
    ///
    /// Autocommit off: should the transaction end underneath the body (a Galera
    /// brute-force abort does, and its error can reach a statement the body never sees),
    /// the body's later statements open a new transaction, which the commit's checks
    /// then roll back, instead of committing one by one. Measured on a three-node
    /// cluster, that is how a message was credited twice.
    const AFTER_MARKER_INSERT: &str = concat!(
        "SET @diesel_inbox_marker_id = LAST_INSERT_ID(), \
         @diesel_inbox_autocommit = @@autocommit, autocommit = 0; SAVEPOINT ",
        savepoint!()
    );

    /// [`AFTER_MARKER_INSERT`] for a batch whose marker id is already recorded.
    const AFTER_MARKER_ID: &str = concat!(
        "SET @diesel_inbox_autocommit = @@autocommit, autocommit = 0; SAVEPOINT ",
        savepoint!()
    );

    impl sealed::Sealed for Mysql {
        fn already_processed<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            CommittedMarkerExists {
                message_id: marker.message_id.clone(),
                consumer: marker.consumer,
            }
            .get_result(conn)
        }

        /// BEGIN, the marker insert and [`AFTER_MARKER_INSERT`] as one text batch, so that
        /// a new message costs the round trips of a bare transaction. The key goes in as
        /// hex literals, which the `VARBINARY` columns store byte for byte, as they do a
        /// bound parameter. The server stops a batch at its first error: a duplicate's
        /// 1062 leaves the transaction open with autocommit untouched.
        fn begin_with_marker<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            let (columns, fingerprint) = match &marker.fingerprint {
                None => ("message_id, consumer", String::new()),
                Some(fingerprint) => (
                    "message_id, consumer, fingerprint",
                    format!(", X'{}'", hex_digits(fingerprint)),
                ),
            };
            let batch = format!(
                "BEGIN; INSERT INTO inbox ({columns}) VALUES (X'{}', X'{}'{fingerprint}); {}",
                hex_digits(&marker.message_id),
                hex_digits(marker.consumer),
                AFTER_MARKER_INSERT,
            );
            async move {
                enter_transaction(conn)?;
                let inserted = match conn.batch_execute(&batch).await {
                    Ok(()) => Ok(true),
                    // Only the insert writes to a unique index.
                    Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
                    // Any statement may have failed, so autocommit may be off already.
                    Err(error) => return Err(savepoint::roll_back_and_restore(conn, error).await),
                };
                end_unless_inserted(conn, inserted).await
            }
        }

        /// In a test transaction: a prepared insert, then [`AFTER_MARKER_INSERT`].
        fn insert_marker<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            let message_id = marker.message_id.clone();
            let consumer = marker.consumer;
            let fingerprint = marker.fingerprint.clone();
            async move {
                let inserted = match fingerprint {
                    None => plain_insert(message_id, consumer).execute(&mut *conn).await,
                    Some(fingerprint) => {
                        fingerprinted_insert(message_id, consumer, fingerprint)
                            .execute(&mut *conn)
                            .await
                    }
                };
                match inserted {
                    Ok(_) => match conn.batch_execute(AFTER_MARKER_INSERT).await {
                        Ok(()) => Ok(true),
                        Err(error) => {
                            // Autocommit may be off already: end the transaction here and
                            // restore it; the caller's ROLLBACK then finds nothing to end.
                            let _explained_by_error = conn
                                .batch_execute(concat!("ROLLBACK; ", restore_autocommit!()))
                                .await;
                            Err(error)
                        }
                    },
                    // Our own statement on our own table: its only unique index besides the
                    // auto-increment key is the inbox's, whatever language the message is in.
                    Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
                    Err(other) => Err(other),
                }
            }
        }

        async fn insert_markers<C>(
            conn: &mut C,
            consumer: &'static str,
            message_ids: Vec<String>,
        ) -> QueryResult<Vec<bool>>
        where
            C: AsyncConnection<Backend = Self>,
        {
            // MySQL has no `INSERT … RETURNING`, and `ON DUPLICATE KEY UPDATE` reports
            // no row of its own (see the module's docs). A plain multi-row INSERT either
            // inserts every marker of the statement or, on a duplicate, none: InnoDB
            // undoes the statement and the transaction goes on. Only a statement that met
            // a duplicate is repeated, one marker per statement, which tells each marker's
            // fate. Each statement takes the keys in ascending order, so overlapping
            // batches wait for each other instead of deadlocking.
            let mut new = Vec::with_capacity(message_ids.len());
            // The last marker inserted, while the last statement inserted it: then
            // `LAST_INSERT_ID()` is one of this transaction's markers.
            let mut own_marker: Option<String> = None;
            let mut last_inserted = false;
            for chunk in chunks(message_ids, MARKERS_PER_STATEMENT) {
                let insert = InsertMarkers {
                    message_ids: chunk.clone(),
                    consumer,
                    suffix: "",
                };
                match insert.execute(&mut *conn).await {
                    Ok(_) => {
                        new.resize(new.len() + chunk.len(), true);
                        own_marker = chunk.last().cloned();
                        last_inserted = true;
                        continue;
                    }
                    Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {}
                    Err(other) => return Err(other),
                }
                for message_id in chunk {
                    let insert = plain_insert(message_id.clone(), consumer);
                    last_inserted = match insert.execute(&mut *conn).await {
                        Ok(_) => true,
                        Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => false,
                        Err(other) => return Err(other),
                    };
                    if last_inserted {
                        own_marker = Some(message_id);
                    }
                    new.push(last_inserted);
                }
            }
            let Some(own_marker) = own_marker else {
                return Ok(new);
            };
            if !last_inserted {
                // A duplicate came last, and `LAST_INSERT_ID()` is not to be trusted after
                // a failed statement: the marker's id is read instead.
                diesel::sql_query(
                    "SET @diesel_inbox_marker_id = \
                     (SELECT id FROM inbox WHERE message_id = ? AND consumer = ?)",
                )
                .bind::<Text, _>(own_marker)
                .bind::<Text, _>(consumer)
                .execute(&mut *conn)
                .await?;
            }
            match conn
                .batch_execute(if last_inserted {
                    AFTER_MARKER_INSERT
                } else {
                    AFTER_MARKER_ID
                })
                .await
            {
                Ok(()) => Ok(new),
                Err(error) => {
                    let _explained_by_error = conn
                        .batch_execute(concat!("ROLLBACK; ", restore_autocommit!()))
                        .await;
                    Err(error)
                }
            }
        }

        fn commit<'c, C>(
            conn: &'c mut C,
        ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            savepoint::commit(conn)
        }

        fn abandon<'c, C>(
            conn: &'c mut C,
        ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            savepoint::abandon(conn)
        }

        async fn prune_bounds<C>(
            conn: &mut C,
            window_micros: i64,
        ) -> QueryResult<Option<PruneBounds>>
        where
            C: AsyncConnection<Backend = Self>,
        {
            diesel::sql_query(
                "SELECT MIN(id) AS start, COALESCE(\
                 (SELECT id FROM inbox \
                 WHERE processed_at >= NOW(6) - INTERVAL ? MICROSECOND \
                 ORDER BY id LIMIT 1), MAX(id) + 1) AS end FROM inbox",
            )
            .bind::<BigInt, _>(window_micros)
            .get_result::<PruneBounds>(conn)
            .await
            .optional()
        }

        async fn prune_batch<C>(
            conn: &mut C,
            window_micros: i64,
            from: i64,
            to: i64,
        ) -> QueryResult<usize>
        where
            C: AsyncConnection<Backend = Self>,
        {
            // A range of the primary key: concurrent pruners lock it in the same order,
            // so one waits for another instead of deadlocking, then finds those rows gone.
            diesel::sql_query(
                "DELETE FROM inbox WHERE id >= ? AND id < ? \
                 AND processed_at < NOW(6) - INTERVAL ? MICROSECOND AND lease_ends_at IS NULL",
            )
            .bind::<BigInt, _>(from)
            .bind::<BigInt, _>(to)
            .bind::<BigInt, _>(window_micros)
            .execute(conn)
            .await
        }

        async fn migrate<C>(conn: &mut C) -> QueryResult<()>
        where
            C: AsyncConnection<Backend = Self>,
        {
            // CREATE TABLE IF NOT EXISTS is atomic DDL, safe to race.
            conn.batch_execute(include_str!(
                "../../migrations/mysql/2026-11-30-000000_create_inbox/up.sql"
            ))
            .await?;
            // A table created by hand may lack the index, and MySQL has no
            // CREATE INDEX IF NOT EXISTS. A concurrent creator's 1061 "Duplicate key
            // name" is success for us, so it is checked again rather than reported.
            if !inbox_index_exists(conn).await? {
                let create =
                    format!("CREATE UNIQUE INDEX {INDEX_NAME} ON inbox (message_id, consumer)");
                match conn.batch_execute(&create).await {
                    Err(_) if inbox_index_exists(conn).await? => {}
                    result => result?,
                }
            }
            // The upgrade to 0.2's columns, where they are missing. One `ALTER TABLE`
            // adds all four or none; a concurrent upgrader's 1060 "Duplicate column
            // name" is success for us, so the columns are counted again.
            if claim_columns_exist(conn).await? {
                return Ok(());
            }
            match conn
                .batch_execute(include_str!(
                    "../../migrations/mysql/2026-12-01-000000_claims/up.sql"
                ))
                .await
            {
                Err(_) if claim_columns_exist(conn).await? => Ok(()),
                result => result,
            }
        }
    }

    /// Fails, quoting [`lost_marker!`], unless this call's marker row is visible: before
    /// the COMMIT, in the transaction about to commit; after it, as committed. On a
    /// Galera node the savepoint proves neither: an abort that lands inside one of our
    /// batches is reported as a warning (see the [`savepoint`] module), so the savepoint
    /// may name a newer transaction, and the COMMIT may end none. Set to itself,
    /// `sql_mode` is unchanged; set to the text, it fails with 1231, whose message
    /// quotes the text in every server language.
    macro_rules! own_marker_visible {
        () => {
            concat!(
                "SET sql_mode = IF(",
                own_marker_exists!(),
                ", @@sql_mode, '",
                lost_marker!(),
                "')"
            )
        };
    }

    /// Whether this call's marker row, by the id its insert recorded, is visible.
    macro_rules! own_marker_exists {
        () => {
            "EXISTS (SELECT 1 FROM inbox WHERE id = @diesel_inbox_marker_id)"
        };
    }

    impl SavepointBackend for Mysql {
        const RELEASE_AND_COMMIT: &'static str = concat!(
            "RELEASE SAVEPOINT ",
            savepoint!(),
            "; ",
            own_marker_visible!(),
            "; COMMIT; ",
            own_marker_visible!(),
            "; ",
            restore_autocommit!()
        );
        const RELEASE_AND_ROLLBACK: &'static str = concat!(
            "RELEASE SAVEPOINT ",
            savepoint!(),
            "; ROLLBACK; ",
            restore_autocommit!()
        );

        fn restore_session<'c, C>(
            conn: &'c mut C,
        ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            conn.batch_execute(restore_autocommit!())
        }

        fn own_marker_committed<'c, C>(
            conn: &'c mut C,
        ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            // Rare: only after the transaction ended underneath the body.
            diesel::select(diesel::dsl::sql::<Bool>(own_marker_exists!())).get_result(conn)
        }
    }

    /// `SELECT EXISTS (… LOCK IN SHARE MODE)` for the fast path. A locking read sees only
    /// committed rows at every isolation level, and waits for a transaction that holds the
    /// key; a plain read at READ UNCOMMITTED would see another delivery's marker before
    /// that delivery commits, or rolls back. MariaDB has no `FOR SHARE`, which diesel's
    /// `for_share()` writes; written by hand, the statement stays in the prepared
    /// statement cache.
    #[derive(QueryId)]
    struct CommittedMarkerExists {
        message_id: String,
        consumer: &'static str,
    }

    impl Query for CommittedMarkerExists {
        type SqlType = Bool;
    }

    impl QueryFragment<Mysql> for CommittedMarkerExists {
        fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
            out.push_sql("SELECT EXISTS (SELECT 1 FROM `inbox` WHERE `message_id` = ");
            out.push_bind_param::<Text, _>(&self.message_id)?;
            out.push_sql(" AND `consumer` = ");
            out.push_bind_param::<Text, _>(self.consumer)?;
            out.push_sql(" LOCK IN SHARE MODE)");
            Ok(())
        }
    }

    async fn claim_columns_exist<C>(conn: &mut C) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = diesel::mysql::Mysql>,
    {
        diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(
            "(SELECT COUNT(*) FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = 'inbox' \
             AND column_name IN ('lease_ends_at', 'claim_token', 'attempts', 'fingerprint')) = 4",
        ))
        .get_result(conn)
        .await
    }

    async fn inbox_index_exists<C>(conn: &mut C) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = diesel::mysql::Mysql>,
    {
        let query = format!(
            "EXISTS (SELECT 1 FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = 'inbox' \
             AND index_name = '{INDEX_NAME}' AND non_unique = 0)"
        );
        diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(&query))
            .get_result(conn)
            .await
    }
}
