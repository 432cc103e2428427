-- _live_row_ok checks waits too (-1 or more; waiting exactly above 0, then one-off and never run):
-- its signature gains the column, so the old one goes. The comments of the table and the column.
-- squawk-ignore ban-drop-function
DROP FUNCTION IF EXISTS queue._live_row_ok(queue.task_status_live, integer, uuid, timestamptz, timestamptz, boolean, interval, timestamptz, text);
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
COMMENT ON TABLE queue.live_tasks IS 'Tasks that can still run (ready, running, error, waiting): the hot table take_next scans. Finished tasks are in queue.history; read both through queue.tasks.';
COMMENT ON COLUMN queue.live_tasks.status IS 'ready, running, error (a retry is scheduled at run_at) or waiting (for the tasks of queue.dependencies to end).';
COMMENT ON COLUMN queue.live_tasks.waits IS 'Above 0: waiting for that many live tasks (enqueue(after => …)), ready when the last ends. -1: a task waits for this one, whose end resolves queue.dependencies (_end_waits). 0: neither.';
