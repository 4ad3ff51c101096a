ALTER TABLE inbox DROP COLUMN key_digest;
