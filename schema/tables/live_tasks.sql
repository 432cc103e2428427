-- The hot table: only tasks that can still run (ready, running, error, waiting). A task that reaches a
-- final state moves to queue.history in the same statement, so this table and its indexes stay
-- the size of the backlog, not of everything ever processed.
-- _live_row_ok(…): the invariants of a live task: attempt not negative; running exactly when it
-- has a lease, its expiry and its start; rerun only while running; a periodic task (repeat of 1
-- second or more) has a slot, a one-off none; a group_key of 1 to 200 characters; waits -1 or more,
-- waiting exactly when above 0, and then one-off, never run. Not a CHECK of
-- the shipped table: PostgreSQL sets a CHECK up again for every statement that writes a row (72 k
-- instructions an enqueue, a sixth of it), and only the queue's functions write this table. The
-- test suite adds it as the CHECK live_tasks_valid to every database it tests (dev.testdb), so
-- every row the tests write is checked; `WHERE NOT queue._live_row_ok(…)` audits a live database.
CREATE FUNCTION queue._live_row_ok(status queue.task_status_live, attempt integer, lease uuid,
                                   lease_expires timestamptz, started timestamptz, rerun boolean,
                                   repeat interval, slot timestamptz, group_key text, waits integer)
    RETURNS boolean
    LANGUAGE plpgsql
    IMMUTABLE
AS $$
BEGIN
    RETURN attempt >= 0
       AND (status = 'running') = (lease IS NOT NULL AND lease_expires IS NOT NULL AND started IS NOT NULL)
       AND (NOT rerun OR status = 'running')
       AND (repeat IS NULL) = (slot IS NULL) AND (repeat IS NULL OR repeat >= interval '1 second')
       AND (group_key IS NULL OR (group_key <> '' AND pg_catalog.length(group_key) <= 200))
       AND waits >= -1 AND (status = 'waiting') = (waits > 0)
       AND (status <> 'waiting' OR (attempt = 0 AND repeat IS NULL));
END
$$;
COMMENT ON FUNCTION queue._live_row_ok(queue.task_status_live, integer, uuid, timestamptz, timestamptz, boolean, interval, timestamptz, text, integer) IS 'Internal: the invariants of a live task. queue.live_tasks ships without a CHECK (only the queue''s functions write it); the test suite adds one calling this. Audit: SELECT id FROM queue.live_tasks WHERE NOT queue._live_row_ok(its columns).';
REVOKE ALL ON FUNCTION queue._live_row_ok(queue.task_status_live, integer, uuid, timestamptz, timestamptz, boolean, interval, timestamptz, text, integer) FROM PUBLIC;

CREATE TABLE queue.live_tasks (
    id             bigint            NOT NULL GENERATED ALWAYS AS IDENTITY,
    stage          text              NOT NULL,
    -- A type of its own, not a CHECK: a table CHECK is set up again for every statement that
    -- writes a row, an enum costs nothing.
    status         queue.task_status_live NOT NULL DEFAULT 'ready',
    priority       integer           NOT NULL DEFAULT 0,
    run_at         timestamptz       NOT NULL DEFAULT now(),
    payload        jsonb             NOT NULL DEFAULT '{}',
    key            text,
    attempt        integer           NOT NULL DEFAULT 0,  -- not negative: queue._live_row_ok
    lease          uuid,
    lease_expires  timestamptz,
    worker         text,
    error_text     text,
    rerun          boolean           NOT NULL DEFAULT false,
    created        timestamptz       NOT NULL DEFAULT now(),
    updated        timestamptz       NOT NULL DEFAULT now(),
    started        timestamptz,
    repeat         interval,
    drift          boolean           NOT NULL DEFAULT true,
    slot           timestamptz,
    group_key      text,
    run_as         regrole,
    progress       jsonb,
    -- Dependencies in one column (each column costs every statement that reads the whole row):
    -- above 0, waiting for that many tasks; -1, some task waits for this one; 0, neither.
    waits          integer           NOT NULL DEFAULT 0,  -- -1 or more, waiting exactly above 0: queue._live_row_ok
    -- The stage's history mode when the task was enqueued (stage_settings.history): NULL keeps all,
    -- so that finish's one-statement move tests one column and other modes end by its slow path.
    history        text,
    -- The stage is in the key so that the table can be distributed by stage (Citus); the identity
    -- alone keeps ids unique, and id leads, so a lookup by id alone still probes this index.
    CONSTRAINT live_tasks_pkey PRIMARY KEY (id, stage)
    -- No CHECK: see queue._live_row_ok above.
);

-- The claim index: exactly the columns take_next filters and orders by, and only waiting rows,
-- so running rows and finished tasks never sit in it.
CREATE INDEX live_tasks_claim ON queue.live_tasks (stage, priority, run_at, id)
    WHERE status IN ('ready', 'error');
-- The running tasks, for the stages with a concurrency limit (they count them per stage and per
-- group) and for reap_hung() (expired leases). One index, not one for each: every take writes an
-- entry into each index of running rows.
CREATE INDEX live_tasks_running ON queue.live_tasks (stage, group_key, lease_expires)
    WHERE status = 'running';
-- A key names at most one live task of a stage (idempotent enqueue, re-run of changed tasks).
CREATE UNIQUE INDEX live_tasks_stage_key ON queue.live_tasks (stage, key)
    WHERE key IS NOT NULL;

COMMENT ON TABLE queue.live_tasks IS 'Tasks that can still run (ready, running, error, waiting): the hot table take_next scans. Finished tasks are in queue.history; read both through queue.tasks.';
COMMENT ON COLUMN queue.live_tasks.id IS 'Task id, kept for the task''s whole life (also in queue.history).';
COMMENT ON COLUMN queue.live_tasks.stage IS 'Stage (queue) the task waits in; take_next(stage) takes from one stage; finish(next_stage => …) moves it on.';
COMMENT ON COLUMN queue.live_tasks.status IS 'ready, running, error (a retry is scheduled at run_at) or waiting (for the tasks of queue.dependencies to end).';
COMMENT ON COLUMN queue.live_tasks.priority IS 'Lower runs first; may be changed while the task waits (queue.set_priority).';
COMMENT ON COLUMN queue.live_tasks.run_at IS 'Earliest time the task may be taken: planned time, or the time of the next retry.';
COMMENT ON COLUMN queue.live_tasks.payload IS 'The work to do, a JSON object or array, handed to the worker as is.';
COMMENT ON COLUMN queue.live_tasks.key IS 'Optional idempotency key, unique among the live tasks of a stage.';
COMMENT ON COLUMN queue.live_tasks.attempt IS 'Number of times the task was taken (the current attempt while running).';
COMMENT ON COLUMN queue.live_tasks.lease IS 'Token of the current attempt; finish, fail and heartbeat must present it. NULL unless running.';
COMMENT ON COLUMN queue.live_tasks.lease_expires IS 'When the current attempt''s lease runs out; after it reap_hung() may recover the task.';
COMMENT ON COLUMN queue.live_tasks.worker IS 'Name the worker gave when it took the task (take_next(worker => …)).';
COMMENT ON COLUMN queue.live_tasks.error_text IS 'Error of the last failed attempt, at most 2,000 characters (longer texts are cut and marked).';
COMMENT ON COLUMN queue.live_tasks.rerun IS 'Enqueued again with mode ''rerun'' while running: its finish or fail queues it again instead of ending it.';
COMMENT ON COLUMN queue.live_tasks.created IS 'When the task was first enqueued.';
COMMENT ON COLUMN queue.live_tasks.updated IS 'When the task last changed state.';
COMMENT ON COLUMN queue.live_tasks.started IS 'When the current attempt was taken.';
COMMENT ON COLUMN queue.live_tasks.repeat IS 'Periodic tasks: the interval between runs (at least 1 second). Finishing a run records it in queue.history and re-arms the same row for the next one. NULL for a one-off task.';
COMMENT ON COLUMN queue.live_tasks.drift IS 'Periodic tasks: true (default) plans the next run from this run''s slot (slot + k * repeat, skipping missed slots); false plans it from the end of the run (finish time + repeat).';
COMMENT ON COLUMN queue.live_tasks.slot IS 'Periodic tasks: the planned time of the current run. Retries move run_at, never slot, so a failed attempt does not shift the schedule. NULL for a one-off task.';
COMMENT ON COLUMN queue.live_tasks.group_key IS 'Optional group (tenant, user, document) for the stage''s group_limit: at most that many tasks of one group run at once. 1 to 200 characters, or NULL for none.';
COMMENT ON COLUMN queue.live_tasks.run_as IS 'SQL tasks (enqueue_sql): the role that enqueued it; run_sql_tasks runs the request as this role. NULL for ordinary tasks. Set only by enqueue_sql, so no producer can make a task run as another role.';
COMMENT ON COLUMN queue.live_tasks.progress IS 'The latest progress a worker reported, heartbeat(…, progress => …): a JSON object or array of at most 1 MiB. Kept when an attempt fails or is released, cleared when the task moves to another stage or re-arms.';
COMMENT ON COLUMN queue.live_tasks.history IS 'The history its stage kept when it was enqueued (configure_stage(history => …)): NULL, all; ''failures'', only a fatal end; ''none'', no row (its end is counted in queue.finished_counts).';
COMMENT ON COLUMN queue.live_tasks.waits IS 'Above 0: waiting for that many live tasks (enqueue(after => …)), ready when the last ends. -1: a task waits for this one, whose end resolves queue.dependencies (_end_waits). 0: neither.';
