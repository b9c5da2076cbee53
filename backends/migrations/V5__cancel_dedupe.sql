-- A posted cancel is deduplicated under the key 'cancel' (see `dedupe_key`),
-- so `post` can refuse other payloads while a cancel waits: give cancels
-- already waiting in an inbox that key.
UPDATE inbox SET dedupe_key = 'cancel' WHERE NOT consumed AND dedupe_key IS NULL AND payload->>'kind' = 'cancel';
