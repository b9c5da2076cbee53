-- An item's own run configuration: serde_json of a JSON merge patch
-- (RFC 7396) that the dispatcher applies to the batch's `config` when it
-- admits the item (`NULL`: the batch's configuration as it is).
ALTER TABLE batch_items ADD COLUMN config text;
