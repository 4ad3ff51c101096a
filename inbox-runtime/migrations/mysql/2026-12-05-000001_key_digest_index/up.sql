-- diesel-inbox 0.3: the unique index on the digest instead of both texts, about 43 bytes
-- a marker instead of 86. One online ALTER: InnoDB builds the new index while inserts
-- go on against the old one, and swaps them at the end. It waits for the table's
-- metadata lock at its start and its end, and every statement on the table waits
-- behind it meanwhile: `diesel_inbox::upgrade_unique_index` runs it with a one-second
-- `lock_wait_timeout`, and tries again. The name is part of the contract:
-- diesel_inbox::classify matches it.
ALTER TABLE inbox
    DROP INDEX ux_inbox_message_consumer,
    ADD UNIQUE INDEX ux_inbox_message_consumer (key_digest),
    ALGORITHM = INPLACE, LOCK = NONE;
