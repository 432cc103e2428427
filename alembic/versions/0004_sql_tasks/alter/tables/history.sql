-- 0004: history keeps an SQL task's role and its response. Nullable columns without a default:
-- a catalog change only, on the parent and every partition.
ALTER TABLE queue.history
    ADD COLUMN run_as regrole,
    ADD COLUMN result jsonb;
COMMENT ON COLUMN queue.history.run_as IS 'SQL tasks (enqueue_sql): the role that enqueued it; run_sql_tasks runs the request as this role. NULL for ordinary tasks. Set only by enqueue_sql, so no producer can make a task run as another role.';
COMMENT ON COLUMN queue.history.result IS 'SQL tasks: the response of a done run, written by run_sql_tasks ({"columns": [{"name", "type"}], "rows": [[…]], "row_count"}, or {"command": …, "row_count"} for a statement that returns no rows); NULL otherwise.';
