-- finish_locked(id, worker, stage): end successfully a task this transaction took with take_locked. The
-- task leaves queue.live_tasks and is written to queue.history as done, with the attempt it ran as,
-- started at the transaction's start and finished at clock time; a periodic task is recorded and
-- re-armed, as finish() does. worker, if given, is recorded in queue.history.
-- The claim, as the lease is to finish(), is the row lock plus take_locked's signed entry in the
-- setting skiplock.held, which this call strikes out (a rolled-back savepoint undoes both). False,
-- changing nothing, for any other task: never taken, another transaction's, already ended, or
-- re-run by this same transaction (left ready for its new payload).
-- Commit the worker's own writes in the same transaction: they and the finish are one.
-- Raises 22004 for a NULL id, 22023 for a long worker name. Locks the task's row (already locked
-- by take_locked); writes queue.live_tasks and queue.history. A task something waits for
-- (enqueue(after => …)) ends by _end_awaited, which resolves what waits for it.
-- stage, when given, is the task's stage (routes the call on Citus); any other: false.
CREATE OR REPLACE FUNCTION queue.finish_locked(id bigint, worker text DEFAULT NULL, stage text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now   timestamptz := pg_catalog.clock_timestamp();
    v_held  text := pg_catalog.current_setting('skiplock.held', true);
    v_entry text;
    v_task  queue.live_tasks;
BEGIN
    IF finish_locked.id IS NULL THEN
        PERFORM queue._raise_bad_argument('finish_locked', 'id');
    ELSIF pg_catalog.length(finish_locked.worker) > 200 THEN
        PERFORM queue._raise_bad_argument('finish_locked', 'worker', finish_locked.worker);
    END IF;
    -- Held by this transaction: take_locked recorded it, signed, and nothing here ended it since.
    SELECT queue._held_entry(k.key, pg_catalog.pg_current_xact_id(), finish_locked.id) INTO v_entry FROM queue.fence_key k;
    IF NOT coalesce(pg_catalog.strpos(v_held, v_entry) > 0, false) THEN RETURN false; END IF;

    -- A deleted task needs no strike-out: a later end finds no row.
    WITH done AS (
        DELETE FROM queue.live_tasks t
         WHERE t.id = finish_locked.id AND t.status IN ('ready', 'error') AND t.repeat IS NULL
           AND t.waits = 0  -- -1, something waits for it: ended below by _end_awaited
           AND (finish_locked.stage IS NULL OR t.stage = finish_locked.stage)
        RETURNING t.*
    )
    INSERT INTO queue.history
    SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt + 1, finish_locked.worker, d.error_text, pg_catalog.now(), v_now)).*
      FROM done d;
    IF FOUND THEN
        RETURN true;
    END IF;

    -- A periodic task: record this run, re-arm the same row for the next one, struck out of the record;
    -- a task something waits for: done, and what waits for it resolved.
    SELECT t.* INTO v_task
      FROM queue.live_tasks t
     WHERE t.id = finish_locked.id AND (finish_locked.stage IS NULL OR t.stage = finish_locked.stage);
    IF v_task.id IS NULL AND finish_locked.stage IS NOT NULL THEN
        RETURN false;  -- a task of another stage than the one given is not this call's: it stays in the record
    END IF;
    PERFORM pg_catalog.set_config('skiplock.held', pg_catalog.replace(v_held, v_entry, ''), true);
    IF v_task.id IS NULL OR v_task.status NOT IN ('ready', 'error') OR (v_task.repeat IS NULL AND v_task.waits = 0) THEN
        RETURN false;  -- held, yet ended by this transaction outside the record (cancel): struck out too
    END IF;
    IF v_task.repeat IS NULL THEN
        PERFORM queue._end_awaited(v_task, 'done', v_task.attempt + 1, finish_locked.worker, v_task.error_text,
                                   pg_catalog.now(), v_now);
    ELSE
        PERFORM queue._rearm(v_task, 'done', v_task.attempt + 1, finish_locked.worker, v_task.error_text,
                             pg_catalog.now(), v_now);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue.finish_locked(bigint, text, text) IS 'Ends successfully a task this transaction took with take_locked: done, to queue.history (a periodic task is re-armed). Only a task this transaction took (row lock and signed entry in skiplock.held) ends; false, changing nothing, otherwise.';
REVOKE ALL ON FUNCTION queue.finish_locked(bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.finish_locked(bigint, text, text) TO skiplock_worker, skiplock_admin;
