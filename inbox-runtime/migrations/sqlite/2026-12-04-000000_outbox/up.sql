-- diesel-inbox: the outbox. A handler's outgoing messages, written in its transaction,
-- which a relay publishes and then marks sent. Times are UTC text with milliseconds,
-- which compare in time order. Unsent rows are few, sent ones many until pruned: the
-- partial indexes hold only the unsent.
CREATE TABLE IF NOT EXISTS inbox_outbox (
    id INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL,
    destination TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    ordering_key TEXT,
    -- The message's place among its ordering key's, in commit order.
    ordering_seq INTEGER,
    headers BLOB NOT NULL,
    payload BLOB NOT NULL,
    enqueued_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    -- When a relay may take it: now, after a failed publish's backoff, or when the lease
    -- of the relay that holds it ends.
    due_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    -- The relay that holds it, until it is sent, retried later or parked.
    relay_token TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    parked BOOLEAN NOT NULL DEFAULT FALSE,
    sent_at TEXT
);
CREATE INDEX IF NOT EXISTS ix_inbox_outbox_unsent ON inbox_outbox (id) WHERE sent_at IS NULL;
CREATE INDEX IF NOT EXISTS ix_inbox_outbox_ordering ON inbox_outbox (ordering_key, ordering_seq)
    WHERE sent_at IS NULL AND ordering_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_inbox_outbox_sent ON inbox_outbox (sent_at) WHERE sent_at IS NOT NULL;
-- One row per ordering key ever used, holding the last number given to its messages.
CREATE TABLE IF NOT EXISTS inbox_outbox_keys (
    ordering_key TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL
);
