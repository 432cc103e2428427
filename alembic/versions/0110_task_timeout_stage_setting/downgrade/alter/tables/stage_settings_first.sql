-- Before the earlier stage_config and configure_stage come back: a view cannot lose a column by
-- CREATE OR REPLACE, and the 12-argument configure_stage must not stay beside the 11-argument one.
DROP VIEW IF EXISTS queue.stage_config;
DROP FUNCTION IF EXISTS queue.configure_stage(text, interval, integer, text, interval, interval, real, boolean, integer, integer, boolean, interval);
