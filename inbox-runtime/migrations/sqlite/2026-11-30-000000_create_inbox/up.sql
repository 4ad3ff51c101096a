-- diesel-inbox: one row per (message, consumer) that has been processed.
-- INTEGER PRIMARY KEY aliases the rowid; TEXT compares with the BINARY collation.
CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL,
    consumer TEXT NOT NULL,
    processed_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP
);
-- The name is part of the contract: diesel_inbox::classify matches it.
CREATE UNIQUE INDEX IF NOT EXISTS ux_inbox_message_consumer ON inbox (message_id, consumer);
