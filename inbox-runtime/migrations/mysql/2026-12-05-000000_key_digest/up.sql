-- diesel-inbox 0.3: a 16-byte digest of (consumer, message_id), the first 128 bits of
-- SHA-256 over the consumer, a zero byte and the key, as PostgreSQL computes it. A
-- VIRTUAL column is computed when read and stored only in the index built on it (the
-- next migration): adding it is instant, and rewrites nothing. Lookups by key name it,
-- so that they use that index:
--     WHERE key_digest = UNHEX(LEFT(SHA2(CONCAT(?consumer, 0x00, ?key), 256), 32))
--       AND message_id = ?key AND consumer = ?consumer
ALTER TABLE inbox
    ADD COLUMN key_digest BINARY(16)
        AS (UNHEX(LEFT(SHA2(CONCAT(consumer, 0x00, message_id), 256), 32))) VIRTUAL;
