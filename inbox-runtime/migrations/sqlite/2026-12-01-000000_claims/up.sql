-- diesel-inbox 0.2: claim mode and payload fingerprints, in the same table and unique index.
-- A marker whose lease_ends_at is NULL is completed: every transactional marker, old
-- ones included, and every finished claim. A claim not yet completed has a lease end
-- ('YYYY-MM-DD HH:MM:SS.SSS', UTC, which compares as text); claim_token names its
-- holder, NULL once released. No index is added: a transactional handler's insert costs
-- what it did.
ALTER TABLE inbox ADD COLUMN lease_ends_at TEXT;
ALTER TABLE inbox ADD COLUMN claim_token TEXT;
ALTER TABLE inbox ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;
ALTER TABLE inbox ADD COLUMN fingerprint TEXT;
