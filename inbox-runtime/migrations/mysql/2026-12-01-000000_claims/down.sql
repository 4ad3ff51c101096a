ALTER TABLE inbox
    DROP COLUMN fingerprint,
    DROP COLUMN attempts,
    DROP COLUMN claim_token,
    DROP COLUMN lease_ends_at;
