-- finish_locked(id, worker, stage, result): end successfully a task this transaction took with
-- take_locked: done, to queue.history with the attempt it ran as (started at the transaction's
-- start), worker and result (a JSON object or array bounded as payloads); a periodic task is
-- recorded and re-armed; a task something waits for ends by _end_awaited.
-- The claim, as the lease is to finish(), is the row lock plus take_locked's signed entry in the
-- setting skiplock.held, which binds the attempt and run_at it took (a replay of the entry after a
-- rolled-back savepoint finds the lock another's or the task changed). False, changing nothing,
-- for any other task: never taken, another transaction's, ended, or changed since the take.
-- Commit the worker's own writes in the same transaction: they and the finish are one.
-- Raises 22004 for a NULL id, 22023 for a long worker name or a scalar result, 54000 for a result
-- over 1 MiB. Locks the task's row (already locked by take_locked); writes queue.live_tasks and
-- queue.history (queue.finished_counts for a stage that keeps no such history). stage, when
-- given, is the task's stage (routes the call on Citus); any other: false.
CREATE OR REPLACE FUNCTION queue.finish_locked(id bigint, worker text DEFAULT NULL, stage text DEFAULT NULL,
                                               result jsonb DEFAULT NULL)
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
    v_key   text;
    v_task  queue.live_tasks;
    v_stage text;
    v_counted boolean;
    v_bad   text;    -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    -- The hot path evaluates only the guard, the CASE's tests joined by OR (a text CASE costs
    -- 8 k more a call: docs/decisions.md); tests/py/test_one_way.py keeps the two the same. An
    -- optional argument's tests, whose functions PL/pgSQL sets up again in every transaction, run
    -- only when one is given.
    IF finish_locked.id IS NULL OR pg_catalog.length(finish_locked.worker) > 200 OR finish_locked.result IS NOT NULL THEN
        v_bad := CASE WHEN finish_locked.id IS NULL THEN 'id'
                      WHEN pg_catalog.length(finish_locked.worker) > 200 THEN 'worker'
                      WHEN finish_locked.result IS NOT NULL THEN 'optional' END;
        IF v_bad = 'optional' THEN
            v_bad := CASE WHEN pg_catalog.jsonb_typeof(finish_locked.result) NOT IN ('object', 'array')
                               OR pg_catalog.pg_column_size(finish_locked.result) > 1048576
                               OR pg_catalog.pg_column_compression(finish_locked.result) IS NOT NULL THEN 'result' END;
        END IF;
        IF v_bad IS NOT NULL THEN
            PERFORM queue._raise_bad_argument('finish_locked', v_bad, pg_catalog.jsonb_build_object(
                'id', finish_locked.id::text, 'worker', finish_locked.worker,
                'result', finish_locked.result::text));
        END IF;
    END IF;
    -- </arguments>
    -- Held by this transaction now, as it took it (docs/decisions.md, "The take_locked fence"):
    -- the row is locked by this transaction (SKIP LOCKED skips another's lock, not this
    -- transaction's own) and take_locked's signed entry, which binds the attempt and run_at it
    -- took, is in the record. A replayed entry of a take that a rolled-back savepoint undid matches
    -- nothing another worker holds, nor a task another transaction failed, re-ran or re-armed since.
    -- A one-off task: found and locked, then deleted by its address, in one statement (as consume).
    SELECT k.key INTO v_key FROM queue.fence_key k;
    WITH done AS (
        DELETE FROM queue.live_tasks t
         WHERE (finish_locked.stage IS NULL OR t.stage = finish_locked.stage)
           AND t.ctid = (SELECT l.ctid
                           FROM queue.live_tasks l
                          WHERE l.id = finish_locked.id AND l.status IN ('ready', 'error') AND l.repeat IS NULL
                            AND l.waits = 0  -- -1, something waits for it: ended below by _end_awaited
                            AND l.history IS NULL  -- a stage that keeps all history; the others: the next statement
                            AND (finish_locked.stage IS NULL OR l.stage = finish_locked.stage)
                            AND pg_catalog.strpos(v_held, queue._held_entry(
                                    pg_catalog.concat(v_key, '/', l.attempt + 1, '/', EXTRACT(epoch FROM l.run_at)),
                                    pg_catalog.pg_current_xact_id(), l.id)) > 0
                            FOR UPDATE SKIP LOCKED)
        RETURNING t.*
    )
    INSERT INTO queue.history
    SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt + 1, finish_locked.worker, d.error_text, pg_catalog.now(), v_now,
                               finish_locked.result)).*
      FROM done d;
    IF FOUND THEN
        RETURN true;  -- deleted, it needs no strike-out: a later end finds no row
    END IF;
    -- A stage that keeps no history of done runs ('none', 'failures'): deleted and counted.
    WITH gone AS (
        DELETE FROM queue.live_tasks t
         WHERE (finish_locked.stage IS NULL OR t.stage = finish_locked.stage)
           AND t.ctid = (SELECT l.ctid
                           FROM queue.live_tasks l
                          WHERE l.id = finish_locked.id AND l.status IN ('ready', 'error') AND l.repeat IS NULL
                            AND l.waits = 0 AND l.history IS NOT NULL
                            AND (finish_locked.stage IS NULL OR l.stage = finish_locked.stage)
                            AND pg_catalog.strpos(v_held, queue._held_entry(
                                    pg_catalog.concat(v_key, '/', l.attempt + 1, '/', EXTRACT(epoch FROM l.run_at)),
                                    pg_catalog.pg_current_xact_id(), l.id)) > 0
                            FOR UPDATE SKIP LOCKED)
        RETURNING t.stage
    ), counted AS (
        -- this backend's row of the minute, as _count_runs counts (one statement, no call: the row
        -- exists but for the minute's first run, which _count_runs then inserts)
        UPDATE queue.finished_counts c
           SET runs = c.runs OPERATOR(pg_catalog.+) 1
         WHERE c.stage = (SELECT g.stage FROM gone g) AND c.status = 'done' AND c.backend = pg_catalog.pg_backend_pid()
           AND (finish_locked.stage IS NULL OR c.stage = finish_locked.stage)  -- Citus: the statement stays on the stage's shard
           AND c.minute = pg_catalog.date_bin(interval '1 minute', pg_catalog.now(), timestamptz '2000-01-01 00:00+00')
        RETURNING 1
    )
    SELECT g.stage, EXISTS (SELECT FROM counted) INTO v_stage, v_counted FROM gone g;
    IF FOUND THEN
        IF NOT v_counted THEN
            PERFORM queue._count_runs(v_stage, 'done');
        END IF;
        RETURN true;
    END IF;

    SELECT t.* INTO v_task
      FROM queue.live_tasks t
     WHERE t.id = finish_locked.id AND t.status IN ('ready', 'error') AND (t.repeat IS NOT NULL OR t.waits < 0)
       AND (finish_locked.stage IS NULL OR t.stage = finish_locked.stage)
       AND pg_catalog.strpos(v_held, queue._held_entry(
               pg_catalog.concat(v_key, '/', t.attempt + 1, '/', EXTRACT(epoch FROM t.run_at)),
               pg_catalog.pg_current_xact_id(), t.id)) > 0
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;  -- not taken here, another transaction's, ended, or changed since (a re-run)
    END IF;
    -- A periodic task: record this run, re-arm the same row for the next one, struck out of the record;
    -- a task something waits for: done, and what waits for it resolved.
    v_entry := queue._held_entry(pg_catalog.concat(v_key, '/', v_task.attempt + 1, '/', EXTRACT(epoch FROM v_task.run_at)),
                                 pg_catalog.pg_current_xact_id(), v_task.id);
    PERFORM pg_catalog.set_config('skiplock.held', pg_catalog.replace(v_held, v_entry, ''), true);
    IF v_task.repeat IS NULL THEN
        PERFORM queue._end_awaited(v_task, 'done', v_task.attempt + 1, finish_locked.worker, v_task.error_text,
                                   pg_catalog.now(), v_now, finish_locked.result);
    ELSE
        PERFORM queue._rearm(v_task, 'done', v_task.attempt + 1, finish_locked.worker, v_task.error_text,
                             pg_catalog.now(), v_now, finish_locked.result);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue.finish_locked(bigint, text, text, jsonb) IS 'Ends successfully a task this transaction took with take_locked: done, to queue.history with result (a periodic task re-arms). Only a task this transaction took (row lock and signed entry in skiplock.held) ends; false, changing nothing, otherwise.';
REVOKE ALL ON FUNCTION queue.finish_locked(bigint, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.finish_locked(bigint, text, text, jsonb) TO skiplock_worker, skiplock_admin;
