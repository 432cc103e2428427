-- 0004: the role an SQL task runs as. Nullable without a default: a catalog change only.
ALTER TABLE queue.live_tasks
    ADD COLUMN run_as regrole;
COMMENT ON COLUMN queue.live_tasks.run_as IS 'SQL tasks (enqueue_sql): the role that enqueued it; run_sql_tasks runs the request as this role. NULL for ordinary tasks. Set only by enqueue_sql, so no producer can make a task run as another role.';
