-- diesel-inbox: one row per (message, consumer) that has been processed.
-- VARBINARY: ids compare byte for byte. A VARCHAR with the usual case-insensitive or
-- PAD SPACE collation would make 'ABC' and 'abc ' the same id, a false duplicate.
-- The surrogate AUTO_INCREMENT key keeps InnoDB's clustered index append-only; the
-- random ids live only in the secondary unique index.
CREATE TABLE IF NOT EXISTS inbox (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    message_id VARBINARY(512) NOT NULL,
    consumer VARBINARY(200) NOT NULL,
    processed_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    -- The name is part of the contract: diesel_inbox::classify matches it.
    UNIQUE KEY ux_inbox_message_consumer (message_id, consumer)
) ENGINE = InnoDB;
