-- diesel-inbox: the outbox. A handler's outgoing messages, written in its transaction,
-- which a relay publishes and then marks sent. VARBINARY, as in the inbox: keys compare
-- byte for byte. LONGBLOB: a payload may exceed BLOB's 64 KiB.
CREATE TABLE IF NOT EXISTS inbox_outbox (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    message_id VARBINARY(512) NOT NULL,
    destination VARBINARY(255) NOT NULL,
    routing_key VARBINARY(255) NOT NULL,
    ordering_key VARBINARY(255) NULL,
    -- The message's place among its ordering key's, in commit order.
    ordering_seq BIGINT NULL,
    headers LONGBLOB NOT NULL,
    payload LONGBLOB NOT NULL,
    -- Times in UTC, whatever a session's time_zone (DATETIME holds no zone).
    enqueued_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- When a relay may take it: now, after a failed publish's backoff, or when the lease
    -- of the relay that holds it ends.
    due_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- The relay that holds it, until it is sent, retried later or parked.
    relay_token VARBINARY(36) NULL,
    attempts INT NOT NULL DEFAULT 0,
    last_error TEXT NULL,
    parked BOOLEAN NOT NULL DEFAULT FALSE,
    sent_at DATETIME(6) NULL,
    KEY ix_inbox_outbox_unsent (sent_at, id),
    KEY ix_inbox_outbox_ordering (ordering_key, sent_at, ordering_seq)
) ENGINE = InnoDB;
-- One row per ordering key ever used, holding the last number given: a transaction that
-- enqueues under a key updates its row, and holds it until it ends, so that one key's
-- messages are numbered in the order their transactions commit. The update is a real
-- change, so that Galera certifies two nodes' transactions on one key against each other.
CREATE TABLE IF NOT EXISTS inbox_outbox_keys (
    ordering_key VARBINARY(255) NOT NULL PRIMARY KEY,
    last_seq BIGINT NOT NULL
) ENGINE = InnoDB;
