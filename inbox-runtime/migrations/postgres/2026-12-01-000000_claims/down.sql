ALTER TABLE inbox
    DROP COLUMN IF EXISTS fingerprint,
    DROP COLUMN IF EXISTS attempts,
    DROP COLUMN IF EXISTS claim_token,
    DROP COLUMN IF EXISTS lease_ends_at;
