-- diesel-inbox 0.2: claim mode and payload fingerprints, in the same table and unique index.
-- A marker whose lease_ends_at is NULL is completed: every transactional marker, old
-- ones included, and every finished claim. A claim not yet completed has a lease end;
-- claim_token names its holder, NULL once released. Columns added at the end of an
-- InnoDB table are an instant change (MariaDB 10.3+, MySQL 8.0.12+), and no index is
-- added: a transactional handler's insert costs what it did.
ALTER TABLE inbox
    ADD COLUMN lease_ends_at DATETIME(6) NULL,
    ADD COLUMN claim_token VARBINARY(36) NULL,
    ADD COLUMN attempts INT NOT NULL DEFAULT 1,
    ADD COLUMN fingerprint VARBINARY(64) NULL;
