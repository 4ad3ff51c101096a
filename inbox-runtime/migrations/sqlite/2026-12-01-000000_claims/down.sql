ALTER TABLE inbox DROP COLUMN fingerprint;
ALTER TABLE inbox DROP COLUMN attempts;
ALTER TABLE inbox DROP COLUMN claim_token;
ALTER TABLE inbox DROP COLUMN lease_ends_at;
