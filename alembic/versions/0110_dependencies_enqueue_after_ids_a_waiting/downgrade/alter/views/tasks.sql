-- Back to 0109: queue.tasks without waits_for. CREATE OR REPLACE VIEW cannot drop a column, so the
-- view goes first; 0109's copy, run next, creates it again with its comments and grants.
DROP VIEW queue.tasks;
