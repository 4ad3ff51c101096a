-- diesel-inbox 0.2: claim mode and payload fingerprints, in the same table and unique index.
-- A marker whose lease_ends_at is NULL is completed: every transactional marker, old
-- ones included, and every finished claim. A claim not yet completed has a lease end;
-- claim_token names its holder, NULL once released. Adding nullable columns and a column
-- with a constant default rewrites nothing (PostgreSQL 11+), and no index is added:
-- a transactional handler's insert costs what it did.
ALTER TABLE inbox
    ADD COLUMN IF NOT EXISTS lease_ends_at timestamptz,
    ADD COLUMN IF NOT EXISTS claim_token text COLLATE "C",
    ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS fingerprint text COLLATE "C";
