-- diesel-inbox 0.3: the unique index holds a 16-byte digest of (consumer, message_id)
-- instead of both texts: about 40 bytes a marker instead of 88, so that a large inbox's
-- index stays in memory. The digest is the first 128 bits of SHA-256 over the
-- consumer's UTF-8 bytes, a zero byte (which text cannot hold) and the key's. The crate
-- compares the stored key whenever an insert meets a marker, so a collision is an
-- error, never a duplicate. Lookups by key name the digest, so that they use the index:
--     WHERE inbox_key_digest(consumer, message_id) = inbox_key_digest($consumer, $key)
--       AND consumer = $consumer AND message_id = $key
--
-- IMMUTABLE, though convert_to is only STABLE: a database's encoding never changes.
-- PL/pgSQL keeps its plan for the session; a SQL function would be planned again for
-- every insert.
CREATE OR REPLACE FUNCTION inbox_key_digest(consumer text, message_id text) RETURNS uuid
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    AS $inbox_key_digest$
BEGIN
    RETURN CAST(encode(substring(sha256(convert_to(consumer, 'UTF8') || decode('00', 'hex')
        || convert_to(message_id, 'UTF8')) FROM 1 FOR 16), 'hex') AS uuid);
END
$inbox_key_digest$;

-- An inbox with markers keeps 0.2's index here: rebuilding it would block every handler
-- for as long as the build takes. `diesel_inbox::upgrade_unique_index` builds the new
-- index beside the old one while handlers run, then swaps them.
DO $inbox_key_digest$ BEGIN
IF NOT EXISTS (SELECT FROM pg_depend WHERE classid = 'pg_class'::regclass
        AND objid = to_regclass('ux_inbox_message_consumer')
        AND refclassid = 'pg_proc'::regclass
        AND refobjid = to_regprocedure('inbox_key_digest(text,text)'))
    AND NOT EXISTS (SELECT FROM inbox) THEN
    DROP INDEX ux_inbox_message_consumer;
    -- The name is part of the contract: diesel_inbox::classify matches it.
    CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox (inbox_key_digest(consumer, message_id));
END IF;
END $inbox_key_digest$;
