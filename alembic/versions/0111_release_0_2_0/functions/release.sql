-- release(id, lease, retry_in, stage): hand a running task back without counting the attempt: a worker
-- shuts down before it could do the work, or cannot do it yet (a rate limit, a resource not ready:
-- a "snooze"). Without retry_in the task is due again at once and keeps its place (priority and
-- run_at unchanged); with it, it is due retry_in from now. Its attempt counter goes back by one, so
-- shutdowns and snoozes never use up max_attempts. A task enqueued again with mode 'rerun' while it
-- ran starts over from attempt 0 with its new payload. A task due at once wakes the stage's waiting
-- workers (_wake_waiters).
-- Returns false, changing nothing, when the lease is not the task's current one. Raises 22004 for a
-- NULL id or lease, 22023 for a negative retry_in. Locks and writes the task's row.
-- stage, when given, is the task's stage (routes the call on Citus); any other: false.
CREATE OR REPLACE FUNCTION queue.release(id bigint, lease uuid, retry_in interval DEFAULT NULL,
                                         stage text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- One plan a session, as finish: without statistics each call would be planned again.
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_stage text;
    v_due   boolean;
    -- A variable, not now() in the statement: Citus refuses non-IMMUTABLE calls in COALESCE and RETURNING.
    v_now   timestamptz := pg_catalog.now();
    v_bad   text;    -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN release.id IS NULL OR release.lease IS NULL THEN 'id, lease'
                  WHEN release.retry_in < interval '0' THEN 'retry_in' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('release', v_bad, pg_catalog.jsonb_build_object(
            'id', release.id::text, 'lease', release.lease::text, 'retry_in', release.retry_in::text));
    END IF;
    -- </arguments>

    UPDATE queue.live_tasks t
       SET status = CASE WHEN t.error_text IS NULL OR t.rerun THEN 'ready'::queue.task_status_live
                         ELSE 'error'::queue.task_status_live END,
           attempt = CASE WHEN t.rerun THEN 0 ELSE GREATEST(t.attempt - 1, 0) END,
           run_at = coalesce(v_now + release.retry_in, t.run_at),
           -- a re-run starts clean: the error belongs to the run it replaced
           error_text = CASE WHEN t.rerun THEN NULL ELSE t.error_text END,
           rerun = false, lease = NULL, lease_expires = NULL, started = NULL, worker = NULL,
           updated = v_now
     WHERE t.id = release.id AND t.lease = release.lease
       AND (release.stage IS NULL OR t.stage = release.stage)
    RETURNING t.stage, t.run_at <= v_now INTO v_stage, v_due;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_due THEN
        PERFORM queue._wake_waiters(v_stage);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue.release(bigint, uuid, interval, text) IS 'Hands a running task back without counting the attempt (a worker shutting down, or a snooze): due again at once in its old place, or retry_in from now. False when the lease is no longer current. Wakes waiting workers when due at once.';
REVOKE ALL ON FUNCTION queue.release(bigint, uuid, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.release(bigint, uuid, interval, text) TO skiplock_worker, skiplock_admin;
