-- Issue 31, replay evals: an item's recorded tools, serde_json of
-- `glia_proto::recorded::RecordedTools` (`NULL`: its run's tools run as
-- usual). The dispatcher puts them in the run's config when it admits the
-- item, and the worker answers the run's calls from them.
ALTER TABLE batch_items ADD COLUMN recorded_tools text;
