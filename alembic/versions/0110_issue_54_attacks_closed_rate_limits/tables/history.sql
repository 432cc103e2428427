-- Finished tasks, partitioned by finish time so that old ones go by dropping partitions, never by
-- mass DELETE. The default partition catches rows when no dated partition covers them.
CREATE TABLE queue.history (
    id          bigint            NOT NULL,
    stage       text              NOT NULL,
    -- Always done, fatal or cancelled: only the queue's functions write here (no role may INSERT).
    -- No CHECK: PostgreSQL sets a table's CHECK expressions up again for every statement that
    -- writes a row, and every finish writes one here.
    status      queue.task_status NOT NULL,
    priority    integer           NOT NULL,
    run_at      timestamptz       NOT NULL,
    payload     jsonb             NOT NULL,
    key         text,
    attempt     integer           NOT NULL,
    worker      text,
    error_text  text,
    created     timestamptz       NOT NULL,
    started     timestamptz,
    finished    timestamptz       NOT NULL,
    group_key   text,
    run_as      regrole,
    result      jsonb
) PARTITION BY RANGE (finished);

CREATE TABLE queue.history_default PARTITION OF queue.history DEFAULT;

CREATE INDEX history_id ON queue.history (id);
CREATE INDEX history_stage_finished ON queue.history (stage, finished);

COMMENT ON TABLE queue.history IS 'Finished runs (done, fatal, cancelled), partitioned by finish time. A task that moved through stages or repeats has a row per finished run.';
COMMENT ON TABLE queue.history_default IS 'Catches finished tasks no dated partition of queue.history covers.';
COMMENT ON COLUMN queue.history.id IS 'Task id, as it was in queue.live_tasks.';
COMMENT ON COLUMN queue.history.stage IS 'Stage the run finished in.';
COMMENT ON COLUMN queue.history.status IS 'done, fatal (failed for good) or cancelled.';
COMMENT ON COLUMN queue.history.priority IS 'Priority when it finished.';
COMMENT ON COLUMN queue.history.run_at IS 'Planned time of the last attempt.';
COMMENT ON COLUMN queue.history.payload IS 'Payload the run worked on.';
COMMENT ON COLUMN queue.history.key IS 'Idempotency key it had.';
COMMENT ON COLUMN queue.history.attempt IS 'Attempts it took.';
COMMENT ON COLUMN queue.history.worker IS 'Worker of the last attempt.';
COMMENT ON COLUMN queue.history.error_text IS 'Error of the last failed attempt, if any (a done task may have failed before it succeeded).';
COMMENT ON COLUMN queue.history.created IS 'When the task was enqueued.';
COMMENT ON COLUMN queue.history.started IS 'When the last attempt started (NULL if it never ran).';
COMMENT ON COLUMN queue.history.finished IS 'When it reached its final state; the partition key.';
COMMENT ON COLUMN queue.history.group_key IS 'Group (tenant, user, document) the task belonged to, if any.';
COMMENT ON COLUMN queue.history.run_as IS 'SQL tasks (enqueue_sql): the role that enqueued it; run_sql_tasks runs the request as this role. NULL for ordinary tasks. Set only by enqueue_sql, so no producer can make a task run as another role.';
COMMENT ON COLUMN queue.history.result IS 'What a done run returned: finish(…, result => …) and its kin (a JSON object or array of at most 1 MiB); for SQL tasks the response run_sql_tasks wrote ({"columns": …, "rows": …, "row_count"}, or {"command": …, "row_count"}). NULL otherwise.';
