DROP INDEX IF EXISTS ux_inbox_message_consumer;
CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox (message_id, consumer);
DROP FUNCTION IF EXISTS inbox_key_digest(text, text);
