-- fail_locked(id, error, fatal, retry_in, worker, stage): end with an error a task this transaction took
-- with take_locked. As fail(): the task waits as 'error', its attempt counted, and is retried after
-- retry_in or the stage's backoff; with fatal => true, or at max_attempts, it is 'fatal', moved to
-- queue.history (a periodic task is recorded and re-armed). Roll back the worker's own writes first,
-- to a savepoint taken after take_locked. As finish_locked: only a task this transaction took (row
-- lock and signed entry in skiplock.held) ends. A task due again at once wakes the stage's waiting
-- workers when this transaction commits (_wake_waiters).
-- Returns true when this call ended the attempt; false, changing nothing, for any other task.
-- Raises 22004 for a NULL id, 22023 for a negative retry_in or a long worker name. Locks the task's
-- row (already locked by take_locked); writes queue.live_tasks, and queue.history when fatal.
-- stage, when given, is the task's stage (routes the call on Citus); any other: false.
CREATE OR REPLACE FUNCTION queue.fail_locked(
        id       bigint,
        error    text,
        fatal    boolean  DEFAULT false,
        retry_in interval DEFAULT NULL,
        worker   text     DEFAULT NULL,
        stage    text     DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now      timestamptz := pg_catalog.clock_timestamp();
    v_task     queue.live_tasks;
    v_attempt  integer;
    v_settings queue.stage_settings;
    v_next     timestamptz;
    v_error    text := queue._bounded_error(coalesce(fail_locked.error, 'failed (no error text given)'));
    v_held     text := pg_catalog.current_setting('skiplock.held', true);
    v_entry    text;
BEGIN
    IF fail_locked.id IS NULL THEN
        RAISE EXCEPTION 'id must not be NULL'
            USING ERRCODE = '22004', DETAIL = 'fail_locked was called with id NULL.',
                  HINT = 'Pass the id that take_locked returned.';
    END IF;
    IF fail_locked.fatal IS NULL THEN
        RAISE EXCEPTION 'fatal must not be NULL'
            USING ERRCODE = '22004', DETAIL = 'fail_locked was called with fatal NULL.',
                  HINT = 'Pass fatal => true to end the task for good, or false (the default) to retry it.';
    END IF;
    IF fail_locked.retry_in < interval '0' THEN
        RAISE EXCEPTION 'retry_in must not be negative'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('retry_in is %s.', fail_locked.retry_in),
                  HINT = 'Use interval ''0'' to retry at once, or NULL for the stage''s backoff.';
    END IF;
    IF pg_catalog.length(fail_locked.worker) > 200 THEN
        RAISE EXCEPTION 'worker name too long'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The worker name has %s characters.', pg_catalog.length(fail_locked.worker)),
                  HINT = 'Name workers in at most 200 characters, e.g. host:pid.';
    END IF;

    -- Held by this transaction: take_locked recorded it, signed, and nothing here ended it since.
    v_entry := queue._held_entry((SELECT k.key FROM queue.fence_key k), pg_catalog.pg_current_xact_id(),
                                 fail_locked.id);
    IF NOT coalesce(pg_catalog.strpos(v_held, v_entry) > 0, false) THEN
        RETURN false;
    END IF;
    SELECT t.* INTO v_task
      FROM queue.live_tasks t
     WHERE t.id = fail_locked.id AND t.status IN ('ready', 'error')
       AND (fail_locked.stage IS NULL OR t.stage = fail_locked.stage);
    IF NOT FOUND THEN
        RETURN false;  -- ended by this transaction outside the record (cancel), or of another stage
    END IF;
    PERFORM pg_catalog.set_config('skiplock.held', pg_catalog.replace(v_held, v_entry, ','), true);
    v_attempt := v_task.attempt + 1;

    v_settings := queue._settings(v_task.stage);
    IF fail_locked.fatal OR v_attempt >= v_settings.max_attempts THEN
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
        SELECT (queue._history_row(v_task, 'fatal', v_attempt, fail_locked.worker, v_error, pg_catalog.now(), v_now)).*;
    ELSE
        v_next := v_now + coalesce(fail_locked.retry_in, queue._retry_delay(v_settings, v_attempt));
        UPDATE queue.live_tasks t
           SET status = 'error', attempt = v_attempt, run_at = v_next,
               error_text = v_error, updated = v_now
         WHERE t.id = v_task.id AND t.stage = v_task.stage;
        IF v_next <= v_now THEN
            PERFORM queue._wake_waiters(v_task.stage);
        END IF;
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue.fail_locked(bigint, text, boolean, interval, text, text) IS 'Ends with an error a task this transaction took with take_locked, as fail() does (retry or fatal). Only a task this transaction took (row lock and signed entry in skiplock.held) ends; false, changing nothing, for any other.';
REVOKE ALL ON FUNCTION queue.fail_locked(bigint, text, boolean, interval, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.fail_locked(bigint, text, boolean, interval, text, text) TO skiplock_worker, skiplock_admin;
