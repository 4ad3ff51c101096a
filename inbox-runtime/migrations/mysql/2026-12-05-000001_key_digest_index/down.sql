ALTER TABLE inbox
    DROP INDEX ux_inbox_message_consumer,
    ADD UNIQUE INDEX ux_inbox_message_consumer (message_id, consumer),
    ALGORITHM = INPLACE, LOCK = NONE;
