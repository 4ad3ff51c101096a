-- diesel-inbox: markers stamped in UTC, whatever a session's time_zone. DATETIME holds
-- no zone, and CURRENT_TIMESTAMP is the session's local time: a marker stamped by a
-- session at -10:00 was pruned at once by a pruner at +13:00, and its redelivery
-- processed again. The crate's statements compare with UTC_TIMESTAMP(6). Changing a
-- default rewrites nothing (ALGORITHM = INSTANT).
ALTER TABLE inbox
    ALTER COLUMN processed_at SET DEFAULT (UTC_TIMESTAMP(6)),
    ALGORITHM = INSTANT;
