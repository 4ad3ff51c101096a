//! PostgreSQL.
//!
//! A duplicate is detected with `INSERT … ON CONFLICT DO NOTHING`: it waits for a
//! concurrent transaction holding the same key, then inserts nothing. No unique violation
//! is raised, so the transaction is never aborted (PostgreSQL would answer its `COMMIT`
//! with a silent `ROLLBACK`) and the server log gets no `ERROR` line per duplicate.
//!
//! The unique index is on a 128-bit digest of (consumer, key), `inbox_key_digest`, which
//! takes half the space of both texts. An insert that meets a marker reads its key back
//! to tell a duplicate from a collision (`markers.rs`); an inbox that 0.2 created keeps
//! its index on both texts until `upgrade_unique_index` swaps it (`upgrade.rs`).

use diesel::result::DatabaseErrorInformation;

use crate::schema::INDEX_NAME;

use super::{is_one_of, starts_with_any};

/// A unique violation names the violated index in its constraint field.
pub(crate) fn names_inbox_index(info: &dyn DatabaseErrorInformation) -> bool {
    info.constraint_name() == Some(INDEX_NAME)
}

/// Serialises concurrent `migrate` calls: concurrent `CREATE TABLE IF NOT EXISTS`
/// can fail on PostgreSQL's catalog unique indexes. The value spells "inboxmig".
#[cfg(feature = "postgres")]
const MIGRATE_LOCK: i64 = 0x696e_626f_786d_6967;

/// diesel-async reports these SQLSTATEs as `Unknown`, with only the message text to go by,
/// in the server's `lc_messages` language (the English texts here, the others in
/// [`TRANSLATED_TRANSIENT`] and the lists beside it): 40P01
/// deadlock, 55P03 lock not available, 57014 a statement cancelled (by `lock_timeout`,
/// `statement_timeout`, `pg_cancel_backend` or a conflict with recovery: a marker insert
/// waiting for another delivery is cut short this way), and 25P02, a transaction
/// aborted by an earlier error that the handler did not propagate. Also the server out
/// of room: 53100, a disk full ("could not extend file …: No space left on device", the
/// operating system's words, which are English unless its C library's translations are
/// installed), and 53200, out of memory or of shared memory. No message is at fault
/// there, and dead-lettered, every message in flight while the disk was full would be
/// lost to the dead letters.
pub(crate) fn is_transient(message: &str) -> bool {
    let english = [
        "deadlock detected",
        "could not obtain lock",
        "canceling statement due to",
        // 40001, which diesel-async reports as `SerializationFailure`; its text is all a
        // wrapper that hides the kind leaves.
        "could not serialize access",
        "out of memory",
        "out of shared memory",
    ];
    starts_with_any(message, &english)
        || message.ends_with(": No space left on device")
        || is_aborted_transaction(message)
        || is_lock_timeout(message)
        || is_one_of(message, TRANSLATED_TRANSIENT)
}

/// 25P02, in the server's language: a statement in a transaction that an earlier error
/// aborted.
pub(crate) fn is_aborted_transaction(message: &str) -> bool {
    starts_with_any(message, ABORTED_TRANSACTION)
}

/// 57014 for a lock time-out (`lock_timeout`), in the server's language.
pub(crate) fn is_lock_timeout(message: &str) -> bool {
    starts_with_any(message, LOCK_TIMEOUT)
}

/// How 25P02's message opens, in English and in each language [`TRANSLATED_TRANSIENT`]
/// lists.
#[rustfmt::skip]
const ABORTED_TRANSACTION: &[&str] = &[
    "current transaction is aborted", // en
    "aktuelle Transaktion wurde abgebrochen, Befehle werden bis zum Ende der Transaktion ignoriert", // de
    "transacción abortada, las órdenes serán ignoradas hasta el fin de bloque de transacción", // es
    "la transaction est annulée, les commandes sont ignorées jusqu'à la fin du bloc\nde la transaction", // fr
    "la transazione corrente è interrotta, i comandi saranno ignorati fino alla fine del blocco della transazione", // it
    "現在のトランザクションがアボートしました。トランザクションブロックが終わるまでコマンドは無視されます", // ja
    "현재 트랜잭션은 중지되어 있습니다. 이 트랜잭션을 종료하기 전까지는 모든 명령이 무시될 것입니다", // ko
    "текущая транзакция прервана, команды до конца блока транзакции игнорируются", // ru
    "aktuella transaktionen har avbrutits, alla kommandon ignoreras tills slutet på transaktionen", // sv
    "поточна транзакція перервана, команди до кінця блока транзакції пропускаються", // uk
    "当前事务已中止，事务块结束之前的命令将被忽略", // zh_CN
    "目前交易已中止，忽略指令直到交易區塊結尾", // zh_TW
];

/// 57014 for a lock time-out, in English and in each language [`TRANSLATED_TRANSIENT`]
/// lists.
#[rustfmt::skip]
const LOCK_TIMEOUT: &[&str] = &[
    "canceling statement due to lock timeout", // en
    "storniere Anfrage wegen Zeitüberschreitung einer Sperre", // de
    "cancelando la sentencia debido a que se agotó el tiempo de espera de candados (locks)", // es
    "annulation de la requête à cause du délai écoulé pour l'obtention des verrous", // fr
    "annullamento dell'istruzione a causa di timeout di lock", // it
    "ロックのタイムアウトのためステートメントをキャンセルしています", // ja
    "გამოსახულება გაუქმდება ბლოკის მოლოდინის ვადის ამოწურვის გამო", // ka
    "잠금 대기 시간 초과로 작업을 취소합니다.", // ko
    "выполнение оператора отменено из-за тайм-аута блокировки", // ru
    "avbryter sats på grund av lås-timeout", // sv
    "виконання оператора скасовано через тайм-аут блокування", // uk
    "由于锁超时，正在取消语句", // zh_CN
    "由於鎖定逾時，正在取消敘述", // zh_TW
];

/// [`is_transient`]'s messages in each language that PostgreSQL translates them into, as
/// a server's `lc_messages` says (which `initdb` takes from the system's locale: a
/// server set up in German writes German). Each as the text before and after the
/// relation's name, or whole where it names none. PostgreSQL 15's translations; a
/// server whose translation words one differently writes one that is not here, which
/// is dead-lettered as before.
#[rustfmt::skip]
const TRANSLATED_TRANSIENT: &[(&str, &str)] = &[
    ("Verklemmung (Deadlock) entdeckt", ""), // de
    ("konnte Sperre für Zeile in Relation »", "« nicht setzen"), // de
    ("konnte Sperre für Relation »", "« nicht setzen"), // de
    ("storniere Anfrage wegen Zeitüberschreitung der Anfrage", ""), // de
    ("storniere Anfrage wegen Benutzeraufforderung", ""), // de
    ("storniere Anfrage wegen Konflikt mit der Wiederherstellung", ""), // de
    ("konnte Zugriff nicht serialisieren wegen gleichzeitiger Aktualisierung", ""), // de
    ("konnte Zugriff nicht serialisieren wegen Lese-/Schreib-Abhängigkeiten zwischen Transaktionen", ""), // de
    ("konnte Zugriff nicht serialisieren wegen gleichzeitigem Löschen", ""), // de
    ("Speicher aufgebraucht", ""), // de
    ("Shared Memory aufgebraucht", ""), // de
    ("se ha detectado un deadlock", ""), // es
    ("no se pudo bloquear un candado en la fila de la relación «", "»"), // es
    ("no se pudo bloquear un candado en la relación «", "»"), // es
    ("cancelando la sentencia debido a que se agotó el tiempo de espera de sentencias", ""), // es
    ("cancelando la sentencia debido a una petición del usuario", ""), // es
    ("cancelando la sentencia debido a un conflicto con la recuperación", ""), // es
    ("no se pudo serializar el acceso debido a un update concurrente", ""), // es
    ("no se pudo serializar el acceso debido a dependencias read/write entre transacciones", ""), // es
    ("no se pudo serializar el acceso debido a un delete concurrente", ""), // es
    ("memoria agotada", ""), // es
    ("memoria compartida agotada", ""), // es
    ("interblocage (deadlock) détecté", ""), // fr
    ("n'a pas pu obtenir un verrou sur la relation « ", " »"), // fr
    ("annulation de la requête à cause du délai écoulé pour l'exécution de l'instruction", ""), // fr
    ("annulation de la requête à la demande de l'utilisateur", ""), // fr
    ("annulation de la requête à cause d'un conflit avec la restauration", ""), // fr
    ("n'a pas pu sérialiser un accès à cause d'une mise à jour en parallèle", ""), // fr
    ("n'a pas pu sérialiser un accès à cause des dépendances de lecture/écriture\nparmi les transactions", ""), // fr
    ("n'a pas pu sérialiser un accès à cause d'une suppression en parallèle", ""), // fr
    ("mémoire épuisée", ""), // fr
    ("mémoire partagée épuisée", ""), // fr
    ("rilevato deadlock", ""), // it
    ("lock di riga nella relazione \"", "\" fallito"), // it
    ("lock della relazione \"", "\" fallito"), // it
    ("annullamento dell'istruzione a causa di timeout", ""), // it
    ("annullamento dell'istruzione su richiesta dell'utente", ""), // it
    ("annullamento dell'istruzione a causa di un conflitto con il ripristino", ""), // it
    ("serializzazione dell'accesso fallita a causa di modifiche concorrenti", ""), // it
    ("serializzazione dell'accesso fallita a causa di dipendenze di lettura/scrittura tra le transazioni", ""), // it
    ("impossibile serializzare l'accesso a causa dell'eliminazione simultanea", ""), // it
    ("memoria esaurita", ""), // it
    ("memoria condivisa esaurita", ""), // it
    ("デッドロックを検出しました", ""), // ja
    ("リレーション\"", "\"の行ロックを取得できませんでした"), // ja
    ("リレーション\"", "\"のロックを取得できませんでした"), // ja
    ("ステートメントのタイムアウトのためステートメントをキャンセルしています", ""), // ja
    ("ユーザーからの要求により文をキャンセルしています", ""), // ja
    ("リカバリで競合が発生したためステートメントをキャンセルしています", ""), // ja
    ("更新が同時に行われたためアクセスの直列化ができませんでした", ""), // ja
    ("トランザクション間で read/write の依存性があったため、アクセスの直列化ができませんでした", ""), // ja
    ("削除が同時に行われたためアクセスの直列化ができませんでした", ""), // ja
    ("メモリ不足です", ""), // ja
    ("共有メモリが足りません", ""), // ja
    ("ნაპოვნია ურთიერთბლოკირება", ""), // ka
    ("ურთიერთობაში \"", "\" მწკრივის დაბლოკვის შეცდომა"), // ka
    ("ბლოკის მიღების შეცდომა ურთიერთობაზე ", "\""), // ka
    ("გამოსახულების გაუქმება აღდგენასთან კონფლიქტის გამო", ""), // ka
    ("ერთდროული განახლების გამო წვდომის სერიალიზაცია შეუძლებელია", ""), // ka
    ("ერთდროული წაშლის გამო წვდომის სერიალიზაცია შეუძლებელია", ""), // ka
    ("არასაკმარისი მეხსიერება", ""), // ka
    ("არასაკმარისი გაზიარებული მეხსიერება", ""), // ka
    ("deadlock 발생했음", ""), // ko
    ("\"", "\" 릴레이션의 잠금 정보를 구할 수 없음"), // ko
    ("명령실행시간 초과로 작업을 취소합니다.", ""), // ko
    ("사용자 요청에 의해 작업을 취소합니다.", ""), // ko
    ("복구 작업 중 충돌이 발생해 작업을 중지합니다.", ""), // ko
    ("동시 업데이트 때문에 순차적 액세스가 불가능합니다", ""), // ko
    ("트랜잭션간 읽기/쓰기 의존성 때문에 serialize 접근을 할 수 없음", ""), // ko
    ("동시 삭제 작업 때문에 순차적 액세스가 불가능합니다", ""), // ko
    ("메모리 부족", ""), // ko
    ("공유 메모리 부족", ""), // ko
    ("обнаружена взаимоблокировка", ""), // ru
    ("не удалось получить блокировку строки в таблице \"", "\""), // ru
    ("не удалось получить блокировку таблицы \"", "\""), // ru
    ("выполнение оператора отменено из-за тайм-аута", ""), // ru
    ("выполнение оператора отменено по запросу пользователя", ""), // ru
    ("выполнение оператора отменено из-за конфликта с процессом восстановления", ""), // ru
    ("не удалось сериализовать доступ из-за параллельного изменения", ""), // ru
    ("не удалось сериализовать доступ из-за зависимостей чтения/записи между транзакциями", ""), // ru
    ("не удалось сериализовать доступ из-за параллельного удаления", ""), // ru
    ("нехватка памяти", ""), // ru
    ("нехватка разделяемой памяти", ""), // ru
    ("deadlock upptäckt", ""), // sv
    ("kunde inte låsa rad i relationen \"", "\""), // sv
    ("kunde inte ta lås på relationen \"", "\""), // sv
    ("avbryter sats på grund av sats-timeout", ""), // sv
    ("avbryter sats på användares begäran", ""), // sv
    ("avbryter sats på grund av konflikt med återställning", ""), // sv
    ("kunde inte serialisera åtkomst på grund av samtidig uppdatering", ""), // sv
    ("kunde inte serialisera åtkomst på grund av läs/skriv-beroenden bland transaktionerna", ""), // sv
    ("kunde inte serialisera åtkomst på grund av samtidig borttagning", ""), // sv
    ("slut på minne", ""), // sv
    ("slut på delat minne", ""), // sv
    ("виявлено взаємне блокування", ""), // uk
    ("не вдалося отримати блокування у рядку стосовно \"", "\""), // uk
    ("не вдалося отримати блокування зв'язку \"", "\""), // uk
    ("виконання оператора скасовано через тайм-аут", ""), // uk
    ("виконання оператора скасовано по запиту користувача", ""), // uk
    ("виконання оператора скасовано через конфлікт з процесом відновлення", ""), // uk
    ("не вдалося серіалізувати доступ через паралельне оновлення", ""), // uk
    ("не вдалося серіалізувати доступ через залежність читання/запису серед транзакцій", ""), // uk
    ("не вдалося серіалізувати доступ через паралельне видалення", ""), // uk
    ("недостатньо пам'яті", ""), // uk
    ("нестача спільної пам'яті", ""), // uk
    ("检测到死锁", ""), // zh_CN
    ("无法获取关系 \"", "\" 中行的锁"), // zh_CN
    ("无法获取关系 \"", "\" 上的锁"), // zh_CN
    ("由于语句执行超时，正在取消语句", ""), // zh_CN
    ("由于用户请求，正在取消语句", ""), // zh_CN
    ("由于与恢复操作冲突，正在取消语句", ""), // zh_CN
    ("由于并发更新，无法串行化访问", ""), // zh_CN
    ("由于事务间的读写依赖，无法串行化访问", ""), // zh_CN
    ("由于并发删除，无法串行化访问", ""), // zh_CN
    ("内存不足", ""), // zh_CN
    ("共享内存不足", ""), // zh_CN
    ("發現死結", ""), // zh_TW
    ("無法取得關聯 \"", "\" 中的資料列鎖定"), // zh_TW
    ("無法取得關聯 \"", "\" 的鎖定"), // zh_TW
    ("因為陳述式逾時，正在取消陳述式", ""), // zh_TW
    ("因為使用者要求，正在取消陳述式", ""), // zh_TW
    ("因為與復原衝突，正在取消陳述式", ""), // zh_TW
    ("因為並行更新，無法序列化存取", ""), // zh_TW
    ("由於交易間的讀寫相依，無法序列化存取", ""), // zh_TW
    ("由於並行刪除，無法序列化存取", ""), // zh_TW
    ("記憶體不足", ""), // zh_TW
    ("共享記憶體用盡", ""), // zh_TW
];

/// A statement that names the key's digest, on an inbox that this version's `migrate` has
/// not reached yet (instances upgrading one by one, or a migration not yet applied):
/// retried, since the next delivery finds it migrated. The function's name stands in
/// the message in every server language.
pub(crate) fn lacks_key_digest(message: &str) -> bool {
    message.contains("inbox_key_digest(")
}

/// A statement that names a claim column, on an inbox of 0.1 that this version's
/// `migrate` has not reached yet: retried, as [`lacks_key_digest`] is. Every server
/// language quotes the column's name.
pub(crate) fn lacks_claim_columns(message: &str) -> bool {
    message.contains("\"lease_ends_at\"")
}

/// A pooler between the client and the server that hands one client's prepared
/// statements to another: PgBouncer in transaction pool mode (before 1.21, or without
/// `max_prepared_statements`) or in statement pool mode. The server finds a statement
/// missing (26000), already there (42P05) or taking other parameters (08P01), or
/// PgBouncer refuses a transaction block. No message is at fault; and where a statement
/// can run as another, no handler can be trusted on the connection.
pub(crate) fn is_shared_statements(message: &str) -> bool {
    (message.starts_with("prepared statement \"")
        && (message.ends_with("\" does not exist") || message.ends_with("\" already exists")))
        || (message.starts_with("bind message supplies ")
            && message.contains(" parameters, but prepared statement \""))
        || message == "transaction blocks not allowed in statement pooling mode"
        || is_one_of(message, TRANSLATED_SHARED_STATEMENTS)
}

/// [`is_shared_statements`]' server messages in each language [`TRANSLATED_TRANSIENT`]
/// lists, each as the text before its first value and after its last.
#[rustfmt::skip]
const TRANSLATED_SHARED_STATEMENTS: &[(&str, &str)] = &[
    ("vorbereitete Anweisung »", "« existiert nicht"), // de
    ("vorbereitete Anweisung »", "« existiert bereits"), // de
    ("Binden-Nachricht enthält ", ""), // de
    ("no existe la sentencia preparada «", "»"), // es
    ("la sentencia preparada «", "» ya existe"), // es
    ("el mensaje de «bind» entrega ", ""), // es
    ("l'instruction préparée « ", " » n'existe pas"), // fr
    ("l'instruction préparée « ", " » existe déjà"), // fr
    ("le message bind fournit ", ""), // fr
    ("l'istruzione preparata \"", "\" non esiste"), // it
    ("l'istruzione preparata \"", "\" esiste già"), // it
    ("il messaggio di bind fornisce ", ""), // it
    ("準備された文\"", "\"は存在しません"), // ja
    ("準備された文\"", "\"はすでに存在します"), // ja
    ("バインドメッセージは", "必要でした"), // ja
    ("მომზადებული ოპერატორი \"", "\" არ არსებობს"), // ka
    ("მომზადებული ოპერატორი \"", "\" უკვე არსებობს"), // ka
    ("\"", "\" 이름의 준비된 명령문(prepared statement) 없음"), // ko
    ("\"", "\" 이름의 준비된 명령문(prepared statement)이 이미 있습니다"), // ko
    ("바인드 메시지는 ", " 개의 매개 변수가 필요합니다"), // ko
    ("подготовленный оператор \"", "\" не существует"), // ru
    ("подготовленный оператор \"", "\" уже существует"), // ru
    ("в сообщении Bind передано неверное число параметров (", ")"), // ru
    ("preparerad sats \"", "\" finns inte"), // sv
    ("preparerad sats \"", "\" finns redan"), // sv
    ("bind-meddelande ger ", ""), // sv
    ("підготовлений оператор \"", "\" не існує"), // uk
    ("підготовлений оператор \"", "\" вже існує"), // uk
    ("в повідомленні bind передано ", ""), // uk
    ("预备语句 \"", "\" 不存在"), // zh_CN
    ("预备语句 \"", "\" 已存在"), // zh_CN
    ("绑定消息提供 ", " 个"), // zh_CN
    ("預備敘述 \"", "\" 不存在"), // zh_TW
    ("預備敘述 \"", "\" 已存在"), // zh_TW
    ("繫結訊息提供 ", ""), // zh_TW
];

/// 25006, a write in a read-only transaction: a standby, a primary being demoted, or
/// `default_transaction_read_only` set during a failover. Another connection, or this
/// one later, can take it.
pub(crate) fn is_read_only(message: &str) -> bool {
    (message.starts_with("cannot execute ") && message.ends_with(" in a read-only transaction"))
        || is_one_of(message, TRANSLATED_READ_ONLY)
}

/// The language codes of PostgreSQL 15's translations, whose texts the recognisers
/// above know ([`TRANSLATED_TRANSIENT`] and the lists beside it).
#[cfg(feature = "postgres")]
const TRANSLATED_LANGUAGES: &[&str] = &[
    "de", "es", "fr", "it", "ja", "ka", "ko", "ru", "sv", "uk", "zh",
];

/// Whether the server words its errors as the recognisers above expect: `lc_messages`
/// in English, untranslated (`C`/`POSIX`), or in one of [`TRANSLATED_LANGUAGES`] (the
/// empty setting follows the server's environment, which is beyond reach, and is taken
/// as it is).
#[cfg(feature = "postgres")]
pub(crate) fn speaks_a_known_language(lc_messages: &str) -> bool {
    let language = lc_messages.to_ascii_lowercase();
    let is_language = |code: &str| {
        language
            .strip_prefix(code)
            .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_alphabetic()))
    };
    language.is_empty()
        || language.starts_with("c.")
        || language == "c"
        || language == "posix"
        || is_language("en")
        || TRANSLATED_LANGUAGES.iter().any(|code| is_language(code))
}

/// 57P01 and its kin: the server ended the session (`pg_terminate_backend`, a shutdown).
pub(crate) fn is_connection_lost(message: &str) -> bool {
    starts_with_any(message, CONNECTION_LOST)
}

/// How [`is_connection_lost`]'s messages open, in English and in each language
/// [`TRANSLATED_TRANSIENT`] lists.
#[rustfmt::skip]
const CONNECTION_LOST: &[&str] = &[
    "terminating connection", // en
    "Verbindung wird abgebrochen wegen Absturz eines anderen Serverprozesses", // de
    "Verbindung wird abgebrochen wegen unerwartetem SIGQUIT-Signal", // de
    "Verbindung wird abgebrochen, weil Protokollsynchronisierung verloren wurde", // de
    "Verbindung wird abgebrochen aufgrund von Anweisung des Administrators", // de
    "Verbindung wird abgebrochen wegen Konflikt mit der Wiederherstellung", // de
    "Verbindung wird abgebrochen wegen Zeitüberschreitung in inaktiver Transaktion", // de
    "Verbindung wird abgebrochen wegen Zeitüberschreitung in inaktiver Sitzung", // de
    "Verbindung wird abgebrochen aufgrund von Befehl für sofortiges Herunterfahren", // de
    "Verbindung wird abgebrochen wegen unerwartetem Ende des Postmasters", // de
    "terminando la conexión debido a una falla en otro proceso servidor", // es
    "terminando la conexión debido a una señal SIGQUIT inesperada", // es
    "terminando la conexión por pérdida de sincronía del protocolo", // es
    "terminando la conexión debido a una orden del administrador", // es
    "terminando la conexión debido a un conflicto con la recuperación", // es
    "terminando la conexión debido a que se agotó el tiempo de espera para transacciones abiertas inactivas", // es
    "terminando la conexión debido a que se agotó el tiempo de espera para sesiones abiertas inactivas", // es
    "terminando la conexión debido a una orden de apagado inmediato", // es
    "terminando la conexión debido al término inesperado de postmaster", // es
    "arrêt de la connexion à cause de l'arrêt brutal d'un autre processus serveur", // fr
    "arrêt des connexions suite à un signal SIGQUIT inattendu", // fr
    "arrêt de la connexion à cause d'une perte de synchronisation du protocole", // fr
    "arrêt des connexions suite à la demande de l'administrateur", // fr
    "arrêt de la connexion à cause d'un conflit avec la restauration", // fr
    "arrêt des connexions suite à l'expiration du délai d'inactivité en transaction", // fr
    "arrêt des connexions suite à l'expiration du délai d'inactivité de la session", // fr
    "arrêt des connexions suite à la commande d'arrêt immédiat", // fr
    "arrêt des connexions suite à un arrêt inattendu du postmaster", // fr
    "la connessione è stata terminata a causa del crash di un altro processo del server", // it
    "terminazione della connessione a causa di un segnale SIGQUIT imprevisto", // it
    "la connessione verrà terminata perché la sincronizzazione del protocollo è stata persa", // it
    "interruzione della connessione su comando dell'amministratore", // it
    "interruzione della connessione a causa di conflitto con il ripristino", // it
    "la connessione è stata terminata a causa di timeout di inattività durante una transazione", // it
    "terminazione della connessione a causa del timeout della sessione inattiva", // it
    "terminazione della connessione a causa di un comando di spegnimento immediato", // it
    "la connessione è stata terminata a causa di un'uscita inattesa di postmaster", // it
    "他のサーバープロセスがクラッシュしたため接続を終了します", // ja
    "予期しないSIGQUITシグナルによりコネクションを終了します", // ja
    "プロトコルの同期が失われたためコネクションを終了します", // ja
    "管理者コマンドにより接続を終了しています", // ja
    "リカバリで競合が発生したため、接続を終了しています", // ja
    "トランザクション中アイドルタイムアウトのため接続を終了します", // ja
    "アイドルセッションタイムアウトにより接続を終了します", // ja
    "即時シャットダウンコマンドによりコネクションを終了します", // ja
    "予期しないpostmasterの終了のため、コネクションを終了します", // ja
    "მიერთება შეწყდება, რადგან პროტოკოლის სინქრონიზაცია დაიკარგა", // ka
    "მიერთების შეწყვეტა ადმინისტრატორის ბრძანების გამო", // ka
    "მიერთების შეწყვეტა აღდგენასთან კონფლიქტის გამო", // ka
    "მიერთების შეწყვეტა დაუყოვნებლივი გამორთვის ბრძანების გამო", // ka
    "მიერთების შეწყვეტა postmaster-ის მოულოდნელი გასვლის გამო", // ka
    "다른 서버 프로세스가 손상을 입어 현재 연결을 중지합니다", // ko
    "예상치 못한 SIGQUIT 신호로 연결을 끝냅니다", // ko
    "프로토콜 동기화 작업 실패로 연결을 종료합니다", // ko
    "관리자 요청에 의해서 연결을 끝냅니다", // ko
    "복구 작업 중 충돌로 연결을 끝냅니다", // ko
    "idle-in-transaction 시간 초과로 연결을 끝냅니다", // ko
    "idle-session 시간 초과로 연결을 끝냅니다", // ko
    "immediate 종료 명령으로 연결을 끝냅니다", // ko
    "postmaster의 예상치 못한 종료로 연결을 종료합니다", // ko
    "закрытие подключения из-за краха другого серверного процесса", // ru
    "закрытие подключения из-за неожиданного сигнала SIGQUIT", // ru
    "закрытие подключения из-за потери синхронизации протокола", // ru
    "закрытие подключения по команде администратора", // ru
    "закрытие подключения из-за конфликта с процессом восстановления", // ru
    "закрытие подключения из-за тайм-аута простоя в транзакции", // ru
    "закрытие подключения из-за тайм-аута простоя сеанса", // ru
    "закрытие подключения вследствие получения команды для немедленного отключения", // ru
    "закрытие подключения из-за неожиданного завершения главного процесса", // ru
    "avbryter anslutning på grund av en krash i en annan serverprocess", // sv
    "stänger anslutning på grund av oväntad SIGQUIT-signal", // sv
    "stänger anslutning då protokollsynkroniseringen tappades", // sv
    "avslutar anslutning på grund av ett administratörskommando", // sv
    "avslutar anslutning på grund av konflikt med återställning", // sv
    "terminerar anslutning på grund av idle-in-transaction-timeout", // sv
    "stänger anslutning på grund av idle-session-timeout", // sv
    "stänger anslutning på grund av kommando för omedelbar nedstängning", // sv
    "avslutar anslutning på grund av att postmaster stängde oväntat ner", // sv
    "завершення підключення через аварійне завершення роботи іншого серверного процесу", // uk
    "завершення підключення через неочікуваний сигнал SIGQUIT", // uk
    "завершення підключення через втрату синхронізації протоколу", // uk
    "завершення підключення по команді адміністратора", // uk
    "завершення підключення через конфлікт з процесом відновлення", // uk
    "завершення підключення через тайм-аут бездіяльності в транзакції", // uk
    "завершення підключення через тайм-аут неактивного сеансу", // uk
    "завершення підключення через команду негайного завершення роботи", // uk
    "завершення підключення через неочікуване закриття головного процесу", // uk
    "由于其他服务器进程崩溃，正在终止连接", // zh_CN
    "由于收到意外的 SIGQUIT 信号，正在终止连接", // zh_CN
    "由于协议同步丢失，正在终止连接", // zh_CN
    "由于管理员命令，正在终止连接", // zh_CN
    "由于与恢复操作冲突，正在终止连接", // zh_CN
    "由于事务内空闲超时，正在终止连接", // zh_CN
    "由于空闲会话超时，正在终止连接", // zh_CN
    "由于立即关闭命令，正在终止连接", // zh_CN
    "由于意外的 postmaster 退出而终止连接", // zh_CN
    "正在結束連線，因為另一個伺服器行程崩潰", // zh_TW
    "由於收到非預期的 SIGQUIT 訊號，正在終止連線", // zh_TW
    "由於協定同步遺失，正在終止連線", // zh_TW
    "因管理員命令，正在中斷連線", // zh_TW
    "因與復原衝突，正在中斷連線", // zh_TW
    "由於交易中閒置逾時，正在終止連線", // zh_TW
    "由於閒置工作階段逾時，正在終止連線", // zh_TW
    "由於立即停止命令，正在終止連線", // zh_TW
    "因 postmaster 意外結束而終止連線", // zh_TW
];

/// [`is_read_only`]'s message in each language [`TRANSLATED_TRANSIENT`] lists, as the
/// text before and after the statement's name.
#[rustfmt::skip]
const TRANSLATED_READ_ONLY: &[(&str, &str)] = &[
    ("", " kann nicht in einer Read-Only-Transaktion ausgeführt werden"), // de
    ("no se puede ejecutar ", " en una transacción de sólo lectura"), // es
    ("ne peut pas exécuter ", " dans une transaction en lecture seule"), // fr
    ("non è possibile eseguire ", " in una transazione a sola lettura"), // it
    ("リードオンリーのトランザクションでは ", " を実行できません"), // ja
    ("읽기 전용 트랜잭션에서는 ", " 명령을 실행할 수 없습니다."), // ko
    ("в транзакции в режиме \"только чтение\" нельзя выполнить ", ""), // ru
    ("kan inte köra ", " i read-only-transaktion"), // sv
    ("не можна виконати ", " в транзакції \"лише для читання\""), // uk
    ("不能在只读事务中执行 ", ""), // zh_CN
    ("唯讀交易中不能執行 ", ""), // zh_TW
];

#[cfg(feature = "postgres")]
mod catalog;
#[cfg(feature = "postgres")]
mod claims;
#[cfg(feature = "postgres")]
mod ddl;
#[cfg(feature = "postgres")]
mod markers;
#[cfg(feature = "postgres")]
mod outbox;
#[cfg(feature = "postgres")]
pub(crate) mod pipeline;
#[cfg(feature = "postgres")]
mod statements;
#[cfg(all(feature = "postgres", feature = "testing"))]
pub(crate) mod testing;
#[cfg(feature = "postgres")]
mod upgrade;
