-- fail_locked(id, error, fatal, retry_in, worker, stage): end with an error a task this transaction took
-- with take_locked. As fail(): the task waits as 'error', its attempt counted, and is retried after
-- retry_in or the stage's backoff; with fatal => true, or at max_attempts, it is 'fatal', moved to
-- queue.history (a periodic task is recorded and re-armed). Roll back the worker's own writes first,
-- to a savepoint taken after take_locked. The row lock is the claim: only a task whose lock belongs
-- to this transaction ends. A task due again at once wakes the stage's waiting workers when this
-- transaction commits (_wake_waiters).
-- Returns true when this call ended the attempt; false, changing nothing, for any other task.
-- Raises 22004 for a NULL id, 22023 for a negative retry_in or a long worker name, 55000 for a task
-- taken inside a savepoint. Locks the task's row (already locked by take_locked); writes
-- queue.live_tasks, and queue.history when fatal.
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
    v_xid      xid := pg_catalog.xid(pg_catalog.pg_current_xact_id());
    v_held     boolean := false;
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

    -- A row locked by this transaction carries its id as xmax (a lock, not a delete). A version
    -- this transaction wrote after the take (fail_locked, a re-arm) inherits the lock, but the task
    -- has ended: its xmin is ours too, and its updated the clock, not now() as an enqueue in this
    -- same transaction writes.
    -- As finish_locked: held by this transaction (xmax, or a multixact after a rolled-back
    -- savepoint: the second pass) and not already ended by it.
    LOOP
        SELECT t.* INTO v_task
          FROM queue.live_tasks t
         WHERE t.id = fail_locked.id
           AND (fail_locked.stage IS NULL OR t.stage = fail_locked.stage)
           AND (t.xmax = v_xid OR v_held)
           AND (t.updated <= pg_catalog.now() OR NOT queue._written_here(t.xmin))
           AND t.status IN ('ready', 'error');
        EXIT WHEN FOUND;
        IF v_held THEN
            RETURN false;
        END IF;
        v_held := queue._held_lock(fail_locked.id, 'fail', fail_locked.stage);
        IF NOT v_held THEN
            RETURN false;
        END IF;
    END LOOP;
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
        INSERT INTO queue.history (id, stage, status, priority, run_at, payload, key, attempt, worker,
                                   error_text, created, started, finished, group_key, run_as)
        VALUES (v_task.id, v_task.stage, 'fatal', v_task.priority, v_task.run_at, v_task.payload,
                v_task.key, v_attempt, fail_locked.worker, v_error, v_task.created, pg_catalog.now(), v_now,
                v_task.group_key, v_task.run_as);
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
COMMENT ON FUNCTION queue.fail_locked(bigint, text, boolean, interval, text, text) IS 'Ends with an error a task this transaction took with take_locked, as fail() does (retry or fatal). Only a task whose row lock belongs to this transaction ends; false, changing nothing, for any other; 55000 when taken in a savepoint.';
REVOKE ALL ON FUNCTION queue.fail_locked(bigint, text, boolean, interval, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.fail_locked(bigint, text, boolean, interval, text, text) TO skiplock_worker, skiplock_admin;
