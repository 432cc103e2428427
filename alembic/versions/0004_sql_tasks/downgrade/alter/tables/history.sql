-- Undo 0004 (runs first): queue.tasks shows the columns, so it goes before them and the
-- previous views/tasks.sql recreates it without them.
DROP VIEW queue.tasks;
ALTER TABLE queue.history
    DROP COLUMN result,
    DROP COLUMN run_as;
