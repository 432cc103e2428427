-- release(id, lease): hand a running task back without counting the attempt, e.g. when a worker
-- shuts down before it could do the work. The task is ready again at once, keeps its place
-- (priority and run_at are unchanged), and its attempt counter goes back by one, so shutdowns
-- never use up max_attempts. A task enqueued again with mode 'rerun' while it ran starts over
-- from attempt 0 with its new payload. Returns false, changing nothing, when the lease is not
-- the task's current one (reaped, retaken, finished or cancelled meanwhile).
-- Downgrade from 0019: the three-argument version goes first (hand-written).
DROP FUNCTION IF EXISTS queue.release(bigint, uuid, interval);
CREATE OR REPLACE FUNCTION queue.release(id bigint, lease uuid)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF release.id IS NULL OR release.lease IS NULL THEN
        RAISE EXCEPTION 'id and lease must not be NULL'
            USING ERRCODE = '22004', HINT = 'Pass the id and lease that take_next returned.';
    END IF;

    UPDATE queue.live_tasks t
       SET status = CASE WHEN t.error_text IS NULL OR t.rerun THEN 'ready'::queue.task_status
                         ELSE 'error'::queue.task_status END,
           attempt = CASE WHEN t.rerun THEN 0 ELSE GREATEST(t.attempt - 1, 0) END,
           rerun = false, lease = NULL, lease_expires = NULL, started = NULL, worker = NULL,
           updated = pg_catalog.now()
     WHERE t.id = release.id AND t.lease = release.lease;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION queue.release(bigint, uuid) IS 'Hands a running task back without counting the attempt (a worker shutting down): ready again at once in its old place, attempt minus one. Returns false when the lease is no longer current. Locks the task''s row.';
REVOKE ALL ON FUNCTION queue.release(bigint, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.release(bigint, uuid) TO skiplock_worker, skiplock_admin;
