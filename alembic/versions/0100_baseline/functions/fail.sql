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
AS $$
DECLARE
    v_now      timestamptz := pg_catalog.now();
    v_task     queue.live_tasks;
    v_settings queue.stage_settings;
    v_next     timestamptz;
    v_error    text := queue._bounded_error(coalesce(fail.error, 'failed (no error text given)'));
BEGIN
    IF fail.id IS NULL OR fail.lease IS NULL THEN
        RAISE EXCEPTION 'id and lease must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('fail was called with id %s and lease %s.',
                                             coalesce(fail.id::text, 'NULL'), coalesce(fail.lease::text, 'NULL')),
                  HINT = 'Pass the id and lease that take_next returned.';
    END IF;
    IF fail.fatal IS NULL THEN
        RAISE EXCEPTION 'fatal must not be NULL'
            USING ERRCODE = '22004', DETAIL = 'fail was called with fatal NULL.',
                  HINT = 'Pass fatal => true to end the task for good, or false (the default) to retry it.';
    END IF;
    IF fail.retry_in < interval '0' THEN
        RAISE EXCEPTION 'retry_in must not be negative'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('retry_in is %s.', fail.retry_in),
                  HINT = 'Use interval ''0'' to retry at once, or NULL for the stage''s backoff.';
    END IF;

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

    v_settings := queue._settings(v_task.stage);
    IF fail.fatal OR v_task.attempt >= v_settings.max_attempts THEN
        IF v_task.repeat IS NULL THEN
            DELETE FROM queue.live_tasks t WHERE t.id = v_task.id AND t.stage = v_task.stage;
        ELSE
            v_next := queue._next_slot(v_task.slot, v_task.repeat, v_task.drift, v_now);
            UPDATE queue.live_tasks t
               SET status = 'ready', attempt = 0, run_at = v_next, slot = v_next,
                   lease = NULL, lease_expires = NULL, started = NULL, worker = NULL,
                   error_text = NULL, updated = v_now
             WHERE t.id = v_task.id AND t.stage = v_task.stage;
        END IF;
        INSERT INTO queue.history
        SELECT (queue._history_row(v_task, 'fatal', v_task.attempt, v_task.worker, v_error, v_task.started, v_now)).*;
    ELSE
        v_next := v_now + coalesce(fail.retry_in, queue._retry_delay(v_settings, v_task.attempt));
        UPDATE queue.live_tasks t
           SET status = 'error', run_at = v_next,
               lease = NULL, lease_expires = NULL, error_text = v_error, updated = v_now
         WHERE t.id = v_task.id AND t.stage = v_task.stage;
        IF v_next <= v_now THEN
            PERFORM queue._wake_waiters(v_task.stage);
        END IF;
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue.fail(bigint, uuid, text, boolean, interval, text) IS 'Ends a running attempt with an error if lease is current: retried after retry_in or the stage''s backoff, or fatal (to queue.history) when fatal => true or attempts are used up; a periodic task is re-armed. False when lease is not current.';
REVOKE ALL ON FUNCTION queue.fail(bigint, uuid, text, boolean, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.fail(bigint, uuid, text, boolean, interval, text) TO skiplock_worker, skiplock_admin;
