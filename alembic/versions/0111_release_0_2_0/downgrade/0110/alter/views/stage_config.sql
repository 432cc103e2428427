-- queue.stage_config loses 0110's rate limit and weight columns: a view cannot drop columns by
-- CREATE OR REPLACE, so it goes here and the previous revision's copy (run next) creates it again.
DROP VIEW IF EXISTS queue.stage_config;
