DROP TABLE IF EXISTS inbox_outbox_keys;
DROP TABLE IF EXISTS inbox_outbox;
