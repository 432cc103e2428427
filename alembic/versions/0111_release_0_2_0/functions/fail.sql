-- fail(id, lease, error, fatal, retry_in, stage): end the attempt that holds `lease` with an error.
-- The task waits as 'error' and is retried after retry_in, or after the stage's backoff. With
-- fatal => true, or at the stage's max_attempts-th attempt, it is 'fatal': moved to queue.history,
-- never retried; a periodic task is then recorded as fatal and re-armed for its next slot (cancel()
-- ends a schedule, one bad run does not). A task enqueued again with mode 'rerun' while it ran is
-- queued again from attempt 0, without this run's error. The error text is cut to 2,000
-- characters. A task due again at once wakes the stage's waiting workers (_wake_waiters).
-- Returns true when this call ended the attempt; false, changing nothing, when lease is not current.
-- Raises 22004 for a NULL id or lease, 22023 for a negative retry_in.
-- Locks the task's row; writes queue.live_tasks, and queue.history when fatal.
-- stage, when given, is the task's stage (routes the call on Citus); any other: false.
CREATE OR REPLACE FUNCTION queue.fail(
        id       bigint,
        lease    uuid,
        error    text,
        fatal    boolean  DEFAULT false,
        retry_in interval DEFAULT NULL,
        stage    text     DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- One plan a session, as finish: without statistics each call would be planned again.
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now      timestamptz := pg_catalog.now();
    v_task     queue.live_tasks;
    v_bad   text;    -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN fail.id IS NULL OR fail.lease IS NULL THEN 'id, lease'
                  WHEN fail.fatal IS NULL THEN 'fatal'
                  WHEN fail.retry_in < interval '0' THEN 'retry_in' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('fail', v_bad, pg_catalog.jsonb_build_object(
            'id', fail.id::text, 'lease', fail.lease::text, 'fatal', fail.fatal::text,
            'retry_in', fail.retry_in::text));
    END IF;
    -- </arguments>

    SELECT t.* INTO v_task
      FROM queue.live_tasks t
     WHERE t.id = fail.id AND t.lease = fail.lease
       AND (fail.stage IS NULL OR t.stage = fail.stage)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    IF v_task.rerun THEN
        UPDATE queue.live_tasks t
           SET status = 'ready', rerun = false, attempt = 0, lease = NULL, lease_expires = NULL,
               started = NULL, error_text = NULL, updated = v_now
         WHERE t.id = v_task.id AND t.stage = v_task.stage;
        IF v_task.run_at <= v_now THEN  -- a re-run may have asked for a later run_at
            PERFORM queue._wake_waiters(v_task.stage);
        END IF;
        RETURN true;
    END IF;

    PERFORM queue._fail_attempt(v_task, v_task.attempt, v_task.worker, v_task.started, fail.error, fail.fatal,
                                fail.retry_in, v_now);
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue.fail(bigint, uuid, text, boolean, interval, text) IS 'Ends a running attempt with an error if lease is current: retried after retry_in or the stage''s backoff, or fatal (to queue.history) when fatal => true or attempts are used up; a periodic task is re-armed. False when lease is not current.';
REVOKE ALL ON FUNCTION queue.fail(bigint, uuid, text, boolean, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.fail(bigint, uuid, text, boolean, interval, text) TO skiplock_worker, skiplock_admin;
