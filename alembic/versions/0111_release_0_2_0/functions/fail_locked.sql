-- fail_locked(id, error, fatal, retry_in, worker, stage): end with an error a task this transaction took
-- with take_locked. As fail(): the task waits as 'error', its attempt counted, and is retried after
-- retry_in or the stage's backoff; with fatal => true, or at max_attempts, it is 'fatal', moved to
-- queue.history (a periodic task is recorded and re-armed). Roll back the worker's own writes first,
-- to a savepoint taken after take_locked. As finish_locked: only a task this transaction took and
-- holds at this moment (row lock, and the signed entry in skiplock.held of the attempt and run_at
-- it took) ends. A task due again at once wakes the stage's waiting workers when this transaction
-- commits (_wake_waiters).
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
    v_held     text := pg_catalog.current_setting('skiplock.held', true);
    v_entry    text;
    v_key      text;
    v_bad   text;    -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN fail_locked.id IS NULL THEN 'id'
                  WHEN fail_locked.fatal IS NULL THEN 'fatal'
                  WHEN fail_locked.retry_in < interval '0' THEN 'retry_in'
                  WHEN pg_catalog.length(fail_locked.worker) > 200 THEN 'worker' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('fail_locked', v_bad, pg_catalog.jsonb_build_object(
            'id', fail_locked.id::text, 'fatal', fail_locked.fatal::text,
            'retry_in', fail_locked.retry_in::text, 'worker', fail_locked.worker));
    END IF;
    -- </arguments>
    -- Held by this transaction now, as it took it: as finish_locked (docs/decisions.md, the fence).
    SELECT k.key INTO v_key FROM queue.fence_key k;
    SELECT t.* INTO v_task
      FROM queue.live_tasks t
     WHERE t.id = fail_locked.id AND t.status IN ('ready', 'error')
       AND (fail_locked.stage IS NULL OR t.stage = fail_locked.stage)
       AND pg_catalog.strpos(v_held, queue._held_entry(
               pg_catalog.concat(v_key, '/', t.attempt + 1, '/', EXTRACT(epoch FROM t.run_at)),
               pg_catalog.pg_current_xact_id(), t.id)) > 0
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;  -- not taken here, another transaction's, ended, changed since, or of another stage
    END IF;
    v_entry := queue._held_entry(pg_catalog.concat(v_key, '/', v_task.attempt + 1, '/', EXTRACT(epoch FROM v_task.run_at)),
                                 pg_catalog.pg_current_xact_id(), v_task.id);
    PERFORM pg_catalog.set_config('skiplock.held', pg_catalog.replace(v_held, v_entry, ''), true);
    PERFORM queue._fail_attempt(v_task, v_task.attempt + 1, fail_locked.worker, pg_catalog.now(), fail_locked.error,
                                fail_locked.fatal, fail_locked.retry_in, v_now);
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue.fail_locked(bigint, text, boolean, interval, text, text) IS 'Ends with an error a task this transaction took with take_locked, as fail() does (retry or fatal). Only a task this transaction took (row lock and signed entry in skiplock.held) ends; false, changing nothing, for any other.';
REVOKE ALL ON FUNCTION queue.fail_locked(bigint, text, boolean, interval, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.fail_locked(bigint, text, boolean, interval, text, text) TO skiplock_worker, skiplock_admin;
