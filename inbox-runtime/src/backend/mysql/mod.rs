//! MySQL and MariaDB.
//!
//! The unique index is on `key_digest`, a virtual column holding a 128-bit digest of
//! (consumer, key) (`upgrade.rs`); a 1062 on it is confirmed by reading the key back
//! (`markers.rs`).
//!
//! The marker is a plain `INSERT`: a duplicate raises 1062, which rolls back only that
//! statement. diesel's `on_conflict_do_nothing` cannot be used: on MySQL it becomes
//! `ON DUPLICATE KEY UPDATE id = id`, which reports one affected row for a new row and for
//! a duplicate alike under diesel-async's `CLIENT_FOUND_ROWS`. `INSERT IGNORE` would also
//! hide truncation and conversion errors.

use diesel::result::DatabaseErrorInformation;

use crate::schema::INDEX_NAME;

use super::{is_one_of, starts_with_any};

#[cfg(feature = "mysql")]
#[macro_use]
mod session;

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

/// 1792, a write in a `READ ONLY` transaction, in every language MariaDB ships it in.
const READ_ONLY_TRANSACTION_MESSAGES: &[&str] = &[
    "Cannot execute statement in a READ ONLY transaction",
    "无法在只读事务中执行语句",
    "No puedo ejecutar sentencia en una transacción READ ONLY",
];

/// 1290, a statement that a server option refuses, as each language opens it: the
/// option is named next, and only `--read-only` (MySQL's `--super-read-only` too) is a
/// state that passes, as a failover promotes another server.
const OPTION_PREVENTS_STATEMENT_OPENINGS: &[&str] = &[
    "The MariaDB server is running with the ",
    "The MySQL server is running with the ",
    "MariaDB服务器使用",
    "Der MariaDB-Server läuft mit der Option ",
    "MariaDB სერვერი ",
    "MariaDBサーバーが ",
    "O servidor MariaDB está rodando com a opção ",
    "El servidor MariaDB se está ejecutando con la opción ",
    "MariaDB är startad med ",
];

/// Whether the server refused a write because the transaction, the session or the
/// server is read-only for now (a replica, or a primary during failover): another
/// connection, or this one later, can take it.
pub(crate) fn is_read_only(message: &str) -> bool {
    starts_with_any(message, READ_ONLY_TRANSACTION_MESSAGES)
        || OPTION_PREVENTS_STATEMENT_OPENINGS.iter().any(|opening| {
            message.strip_prefix(opening).is_some_and(|option| {
                option.trim_start().starts_with("--read-only")
                    || option.trim_start().starts_with("--super-read-only")
            })
        })
}

/// How every marker insert in a transaction begins. Where a session has `unique_checks`
/// and `foreign_key_checks` off (as a dump's restore leaves it), MariaDB buffers the
/// first inserts into an empty table in bulk, and a later failed statement of the
/// transaction, one a body handled, undoes the buffer while the transaction goes on:
/// the body committed without its marker, and each redelivery ran again. The insert
/// turns the checks back on for itself, in a comment that only MariaDB, which has that
/// bulk mode, executes.
#[cfg(feature = "mysql")]
macro_rules! checked_insert {
    () => {
        "/*M! SET STATEMENT unique_checks = 1 FOR */ INSERT"
    };
}

/// [`checked_insert!`], for the text batches.
#[cfg(feature = "mysql")]
const CHECKED_INSERT: &str = checked_insert!();

/// A column of the crate's inbox that every marker insert names, with its `DEFAULT` (the
/// only value a virtual column takes). An insert into another table called `inbox` that
/// has no unique index (an application's own) would insert every time, every redelivery
/// processed again; naming the column fails there instead, as [`lacks_key_digest`], and
/// the session check says which table was found.
#[cfg(feature = "mysql")]
const OWN_COLUMN: &str = "key_digest";

/// A `LIMIT` that keeps every row. A session's `sql_select_limit` (a client's safety net,
/// as database tools set it) cuts the rows of every `SELECT` without a `LIMIT` of its
/// own, to none at 0: each of the crate's reads has one, `LIMIT 1` where one row is
/// read.
#[cfg(feature = "mysql")]
const EVERY_ROW: &str = "LIMIT 18446744073709551615";

/// The shape of the marker inserts bound as parameters.
#[cfg(feature = "mysql")]
const MARKER_INSERT: super::queries::InsertShape = super::queries::InsertShape {
    insert: CHECKED_INSERT,
    own_column: Some(OWN_COLUMN),
};

/// 1054 for the digest's column, on an inbox that this version's `migrate` has not
/// reached yet (instances upgrading one by one, or a migration not yet applied):
/// retried, since the next delivery finds it migrated. Every server language quotes the
/// column's name.
pub(crate) fn lacks_key_digest(message: &str) -> bool {
    message.contains("'key_digest'")
}

/// 1114, a table that is full: InnoDB's answer when the disk is (a MEMORY table's at its
/// `max_heap_table_size`). No message is at fault, and dead-lettered, every message in
/// flight while the disk was full would be lost to the dead letters. Each translation,
/// as the text before and after the table's name.
const TABLE_FULL_MESSAGES: &[(&str, &str)] = &[
    ("表'", "'已满"),
    ("Tabulka '", "' je plná"),
    ("Tabellen '", "' er fuld"),
    ("The table '", "' is full"),
    ("Tabel '", "' on täis"),
    ("La table '", "' est pleine"),
    ("Tabelle '", "' ist voll"),
    ("ცხრილი '", "' სავსეა"),
    ("Ο πίνακας '", "' είναι γεμάτος"),
    ("टेबल '", "' पूरा भरा है"),
    ("A '", "' tabla megtelt"),
    ("La tabella '", "' e` piena"),
    ("表 '", "' は満杯です。"),
    ("테이블 '", "'가 full났습니다."),
    ("De tabel '", "' is vol"),
    ("Tabela '", "' está cheia"),
    ("Tabela '", "' e plina"),
    ("Таблица '", "' переполнена"),
    ("Tabela '", "' je popunjena do kraja"),
    ("Tabuľka '", "' je plná"),
    ("La tabla '", "' está llena"),
    ("Tabellen '", "' är full"),
    ("Таблиця '", "' заповнена"),
];

/// 1020, a row that another transaction changed after this one's snapshot read it:
/// MariaDB's `innodb_snapshot_isolation`, on by default from 11.6, refuses the write or
/// locking read at REPEATABLE READ and rolls the transaction back. A retry reads the row
/// afresh. Each translation, as the text before and after the table's name.
const RECORD_CHANGED_MESSAGES: &[(&str, &str)] = &[
    ("这个表自上次读后数据有变化'", "';尝试重新启动事务"),
    ("Záznam byl změněn od posledního čtení v tabulce '", "'"),
    (
        "Posten er ændret siden sidste læsning '",
        "'; Prøv at genstarte transaktionen",
    ),
    (
        "Record has changed since last read in table '",
        "'; try restarting transaction",
    ),
    (
        "Kirje tabelis '",
        "' on muutunud viimasest lugemisest saadik; alusta transaktsiooni otsast",
    ),
    (
        "Enregistrement modifié depuis sa dernière lecture dans la table '",
        "' : essayez de redémarrer la transaction",
    ),
    (
        "Datensatz hat sich seit dem letzten Zugriff auf Tabelle '",
        "' geändert. Versuchen Sie, die Transaktion neu zu starten",
    ),
    (
        "ცხრილში '",
        "' ჩანაწერი შეიცვალა ბოლო წაკითხვის შემდეგ. სცადეთ, ტრანზაქცია თავიდან გაუშვათ",
    ),
    (
        "Η εγγραφή έχει αλλάξει από την τελευταία φορά που ανασύρθηκε από τον πίνακα '",
        "'",
    ),
    ("रिकॉर्ड टेबल '", "' पिछली बार पढ़े जाने के बाद से बदल गया है"),
    (
        "A(z) '",
        "' tablaban talalhato rekord megvaltozott az utolso olvasas ota",
    ),
    (
        "Il record e` cambiato dall'ultima lettura della tabella '",
        "'; Provare a far ripartire la transazione",
    ),
    (
        "表 '",
        "' の最後の読み込み時点から、レコードが変化しました。トランザクションを再試行してください。",
    ),
    (
        "테이블 '",
        "'에서 마지막으로 읽은 후 Record가 변경되었습니다.",
    ),
    (
        "Record is veranderd sinds de laatste lees activiteit in de tabel '",
        "'; Probeer herstart van de transactie",
    ),
    ("Posten har blitt endret siden den ble lest '", "'"),
    (
        "Posten har vorte endra sidan den sist vart lesen '",
        "'; Prøv å starte transaksjonen på nytt",
    ),
    (
        "Rekord został zmieniony od ostaniego odczytania z tabeli '",
        "'",
    ),
    (
        "Registro alterado desde a última leitura da tabela '",
        "'. Tente reiniciar a transação",
    ),
    (
        "Cimpul a fost schimbat de la ultima citire a tabelei '",
        "'",
    ),
    (
        "Запись изменилась с момента последней выборки в таблице '",
        "'; Попробуйте перезапустить транзакцию",
    ),
    (
        "Slog je promenjen od zadnjeg čitanja tabele '",
        "'; Probajte da restartujete transakciju",
    ),
    ("Záznam bol zmenený od posledného čítania v tabuľke '", "'"),
    (
        "El registro ha cambiado desde la ultima lectura de la tabla '",
        "'; intente volver a comenzar la transacción",
    ),
    (
        "Posten har förändrats sedan den lästes i register '",
        "'. Försök att starta om transaktionen",
    ),
    (
        "Запис було змінено з часу останнього читання з таблиці '",
        "'; спробуйте перезапустити транзакцію.",
    ),
];

/// Whether a MySQL/MariaDB error that diesel-async reports as `Unknown` is worth a
/// retry: lock conflicts, snapshot conflicts and interrupted waits in any server
/// language, a table or disk that is full, and a transaction rolled back under a nested
/// savepoint.
pub(crate) fn is_transient(message: &str) -> bool {
    starts_with_any(message, RETRYABLE_SERVER_MESSAGES)
        || is_one_of(message, RECORD_CHANGED_MESSAGES)
        || is_one_of(message, TABLE_FULL_MESSAGES)
        // 3, a file the server could not write for want of room (errno 28), as MariaDB
        // and as MySQL word the error number.
        || message.contains("28 \"No space left on device\")")
        || message.contains("28 - No space left on device)")
        || is_lost_diesel_savepoint(message)
}

/// The driver's texts for a connection that is gone, and a Galera node's for having left
/// the cluster's primary component (reconnect to another node, or to this one once it
/// has rejoined): 1047 for a statement sent after it left, and 1180 for a commit, or an
/// autocommitted statement, in flight as it left, whose write set never reached the
/// cluster. wsrep writes both in English whatever `lc_messages` says.
pub(crate) fn is_connection_lost(message: &str) -> bool {
    [
        "WSREP has not yet prepared node for application use",
        "provider status: Not connected to Primary Component",
        "provider status: Provider in bad state",
        "Input/output error",
        "Lost connection to",
        "server has gone away",
        "Connection was killed",
        "Connection to the server is closed",
        // mysql_async on a connection whose reply to a statement was cut off by a
        // cancelled future: the next statement reads that reply as its own.
        "Driver error: `Packet out of order.'",
        "Driver error: `Unexpected packet.'",
        "Driver error: `Statement takes ",
    ]
    .iter()
    .any(|pattern| message.contains(pattern))
}

#[cfg(feature = "mysql")]
mod call;
#[cfg(feature = "mysql")]
mod claims;
#[cfg(feature = "mysql")]
mod ddl;
#[cfg(feature = "mysql")]
mod markers;
#[cfg(feature = "mysql")]
mod outbox;
#[cfg(feature = "mysql")]
mod statements;
#[cfg(all(feature = "mysql", feature = "testing"))]
pub(crate) mod testing;
#[cfg(feature = "mysql")]
mod upgrade;
