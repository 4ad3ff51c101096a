-- diesel-inbox 0.3: the unique index holds a 16-byte digest of (consumer, message_id)
-- instead of both texts: about 40 bytes a marker instead of 88, so that a large inbox's
-- index stays in memory. The digest is the first 128 bits of SHA-256 over the
-- consumer's bytes, a zero byte (which text cannot hold) and the key's, in the
-- database's encoding (UTF-8 in nearly every database; the encoding never changes).
-- The crate compares the stored key whenever an insert meets a marker, so a collision
-- is an error, never a duplicate. Lookups by key name the digest, so that they use the
-- index:
--     WHERE inbox_key_digest(consumer, message_id) = inbox_key_digest($consumer, $key)
--       AND consumer = $consumer AND message_id = $key
--
-- A SQL function of immutable built-ins, which PostgreSQL inlines into the index
-- expression and into the statements that call it on columns or parameters: no
-- function call per insert. A text's bytes come from a cast to bytea, whose input reads
-- backslashes as escapes, so each is doubled first. Every name is qualified, and the
-- backslashes are written in E'' literals, so that neither a session's search_path nor
-- its standard_conforming_strings changes what the inlined expression means.
CREATE OR REPLACE FUNCTION inbox_key_digest(consumer text, message_id text) RETURNS uuid
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $inbox_key_digest$
SELECT CAST(pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(
    CAST(pg_catalog.replace(consumer COLLATE pg_catalog."C", E'\\', E'\\\\') AS pg_catalog.bytea)
    OPERATOR(pg_catalog.||) pg_catalog.decode('00', 'hex')
    OPERATOR(pg_catalog.||)
    CAST(pg_catalog.replace(message_id COLLATE pg_catalog."C", E'\\', E'\\\\') AS pg_catalog.bytea)),
    1, 16), 'hex') AS pg_catalog.uuid)
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
