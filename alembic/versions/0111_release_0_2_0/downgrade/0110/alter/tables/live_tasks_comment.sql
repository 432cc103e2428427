-- Back to 0109: _live_row_ok without waits, the table's comments, and enqueue without after (the
-- downgrade restored the nine-argument one beside it).
-- squawk-ignore ban-drop-function
DROP FUNCTION IF EXISTS queue._live_row_ok(queue.task_status_live, integer, uuid, timestamptz, timestamptz, boolean, interval, timestamptz, text, integer);
CREATE FUNCTION queue._live_row_ok(status queue.task_status_live, attempt integer, lease uuid,
                                   lease_expires timestamptz, started timestamptz, rerun boolean,
                                   repeat interval, slot timestamptz, group_key text)
    RETURNS boolean
    LANGUAGE plpgsql
    IMMUTABLE
AS $$
BEGIN
    RETURN attempt >= 0
       AND (status = 'running') = (lease IS NOT NULL AND lease_expires IS NOT NULL AND started IS NOT NULL)
       AND (NOT rerun OR status = 'running')
       AND (repeat IS NULL) = (slot IS NULL) AND (repeat IS NULL OR repeat >= interval '1 second')
       AND (group_key IS NULL OR (group_key <> '' AND pg_catalog.length(group_key) <= 200));
END
$$;
COMMENT ON FUNCTION queue._live_row_ok(queue.task_status_live, integer, uuid, timestamptz, timestamptz, boolean, interval, timestamptz, text) IS 'Internal: the invariants of a live task. queue.live_tasks ships without a CHECK (only the queue''s functions write it); the test suite adds one calling this. Audit: SELECT id FROM queue.live_tasks WHERE NOT queue._live_row_ok(its columns).';
REVOKE ALL ON FUNCTION queue._live_row_ok(queue.task_status_live, integer, uuid, timestamptz, timestamptz, boolean, interval, timestamptz, text) FROM PUBLIC;
COMMENT ON TABLE queue.live_tasks IS 'Tasks that can still run (ready, running, error): the hot table take_next scans. Finished tasks are in queue.history; read both through queue.tasks.';
COMMENT ON COLUMN queue.live_tasks.status IS 'ready, running or error (a retry is scheduled at run_at).';
-- squawk-ignore ban-drop-function
DROP FUNCTION IF EXISTS queue.enqueue(jsonb, text, integer, timestamptz, text, text, interval, boolean, text, bigint[], text);
