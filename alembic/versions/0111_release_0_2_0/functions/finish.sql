-- finish(id, lease, next_stage, stage, result): end the attempt that holds `lease` successfully.
-- Without next_stage the task is done: it leaves queue.live_tasks for queue.history in one
-- statement. With next_stage (a pipeline) it is recorded as done in its stage and waits, ready, in
-- next_stage from attempt 0, with result (if given) as its payload. A task enqueued again with mode
-- 'rerun' while it ran is queued again instead. A periodic task is recorded done and re-armed.
-- result (a JSON object or array, bounded as payloads) is kept in the run's history row. A task
-- something waits for (enqueue(after => …)) ends by _end_awaited, which resolves its waiters.
-- Returns true when this call ended the attempt; false, changing nothing, for a lease not current.
-- Raises 22004 for a NULL id or lease; 22023 for a bad next_stage, one for a periodic task, or a
-- scalar result; 54000 for a result over 1 MiB; 42501 for a restricted next_stage without the
-- enqueue right; SK002 when a live task of next_stage has the key. Locks the task's row; writes
-- queue.live_tasks and queue.history (queue.finished_counts for a stage that keeps no such
-- history: configure_stage(history => …)). stage, when given, is the task's stage (routes the call on
-- Citus); any other: false.
CREATE OR REPLACE FUNCTION queue.finish(id bigint, lease uuid, next_stage text DEFAULT NULL,
                                        stage text DEFAULT NULL, result jsonb DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- One plan a session: without statistics the generic plan looked dearer, and each call was planned
    -- again (six times its execution).
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now   timestamptz := pg_catalog.now();
    v_count integer;
    v_next  queue.stage_settings;
    v_stage text;
    v_due   boolean;
    v_counted boolean;
    v_task  queue.live_tasks;
    v_bad   text;    -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    -- The hot path evaluates only the guard, the CASE's tests joined by OR (a text CASE costs
    -- 8 k more a call: docs/decisions.md); tests/py/test_one_way.py keeps the two the same. An
    -- optional argument's tests, whose functions PL/pgSQL sets up again in every transaction, run
    -- only when one is given.
    IF finish.id IS NULL OR finish.lease IS NULL OR finish.result IS NOT NULL OR finish.next_stage IS NOT NULL THEN
        v_bad := CASE WHEN finish.id IS NULL OR finish.lease IS NULL THEN 'id, lease'
                      WHEN finish.result IS NOT NULL OR finish.next_stage IS NOT NULL THEN 'optional' END;
        IF v_bad = 'optional' THEN
            v_bad := CASE WHEN finish.next_stage IN ('', '*') OR pg_catalog.octet_length(finish.next_stage) > 54 THEN 'next_stage'
                          -- last: measured uncompressed there, a compressed result may turn out to fit
                          WHEN pg_catalog.jsonb_typeof(finish.result) NOT IN ('object', 'array')
                               OR pg_catalog.pg_column_size(finish.result) > 1048576
                               OR pg_catalog.pg_column_compression(finish.result) IS NOT NULL THEN 'result' END;
        END IF;
        IF v_bad IS NOT NULL THEN
            PERFORM queue._raise_bad_argument('finish', v_bad, pg_catalog.jsonb_build_object(
                'id', finish.id::text, 'lease', finish.lease::text, 'next_stage', finish.next_stage, 'result', finish.result::text));
        END IF;
    END IF;
    -- </arguments>

    IF finish.next_stage IS NULL THEN
        WITH done AS (
            DELETE FROM queue.live_tasks t
             WHERE t.id = finish.id AND t.lease = finish.lease AND NOT t.rerun AND t.repeat IS NULL
               AND t.waits = 0  -- -1, something waits for it: ended below by _end_awaited
               AND t.history IS NULL  -- a stage that keeps all history; the others: the next statement
               AND (finish.stage IS NULL OR t.stage = finish.stage)
            RETURNING t.*
        )
        INSERT INTO queue.history
        SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt, d.worker, d.error_text, d.started, v_now,
                                   finish.result)).*
          FROM done d;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count = 1 THEN
            RETURN true;
        END IF;
        -- A stage that keeps no history of done runs ('none', 'failures'): deleted and counted.
        WITH gone AS (
            DELETE FROM queue.live_tasks t
             WHERE t.id = finish.id AND t.lease = finish.lease AND NOT t.rerun AND t.repeat IS NULL
               AND t.waits = 0 AND t.history IS NOT NULL
               AND (finish.stage IS NULL OR t.stage = finish.stage)
            RETURNING t.stage
        ), counted AS (
            -- this backend's row of the minute, as _count_runs counts (one statement, no call: the row
            -- exists but for the minute's first run, which _count_runs then inserts)
            UPDATE queue.finished_counts c
               SET runs = c.runs OPERATOR(pg_catalog.+) 1
             WHERE c.stage = (SELECT g.stage FROM gone g) AND c.status = 'done' AND c.backend = pg_catalog.pg_backend_pid()
               AND (finish.stage IS NULL OR c.stage = finish.stage)  -- Citus: the statement stays on the stage's shard
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

        -- A periodic task: record this run, re-arm the same row for the next one. A task something
        -- waits for: done, and what waits for it resolved.
        SELECT t.* INTO v_task
          FROM queue.live_tasks t
         WHERE t.id = finish.id AND t.lease = finish.lease AND NOT t.rerun AND (t.repeat IS NOT NULL OR t.waits < 0)
           AND (finish.stage IS NULL OR t.stage = finish.stage)
           FOR UPDATE;
        IF FOUND THEN
            IF v_task.repeat IS NULL THEN
                PERFORM queue._end_awaited(v_task, 'done', v_task.attempt, v_task.worker, v_task.error_text, v_task.started, v_now,
                                           finish.result);
            ELSE
                PERFORM queue._rearm(v_task, 'done', v_task.attempt, v_task.worker, v_task.error_text, v_task.started, v_now,
                                     finish.result);
            END IF;
            RETURN true;
        END IF;
    ELSE
        -- Moving a task into a stage is enqueueing into it: a restricted one needs that right.
        v_next := queue._settings(finish.next_stage);
        IF v_next.restricted THEN
            PERFORM queue._check_access(finish.next_stage, 'enqueue');
        END IF;
        BEGIN
            -- The row moves by DELETE and INSERT, with its id: the stage is in the key, and on Citus
            -- it is the distribution key, which no UPDATE may change (the row may change node).
            WITH cur AS (
                DELETE FROM queue.live_tasks t
                 WHERE t.id = finish.id AND t.lease = finish.lease AND NOT t.rerun AND t.repeat IS NULL
                   AND (finish.stage IS NULL OR t.stage = finish.stage)
                RETURNING t.*
            ), moved AS (
                INSERT INTO queue.live_tasks (id, stage, status, priority, run_at, payload, key, attempt,
                                              created, updated, drift, group_key, run_as, waits, history)
                OVERRIDING SYSTEM VALUE
                SELECT c.id, finish.next_stage, 'ready', c.priority, v_now, coalesce(finish.result, c.payload), c.key, 0,
                       c.created, v_now, c.drift, c.group_key, c.run_as, c.waits,
                       CASE WHEN c.run_as IS NULL THEN v_next.history END  -- the next stage's mode (SQL tasks keep all)
                  FROM cur c
            ), kept AS (
                INSERT INTO queue.history
                SELECT (queue._history_row(c::queue.live_tasks, 'done', c.attempt, c.worker, c.error_text, c.started, v_now,
                                           finish.result)).*
                  FROM cur c
                 WHERE c.history IS NULL
            )
            SELECT c.stage, c.history IS NOT NULL INTO v_stage, v_counted FROM cur c;
            GET DIAGNOSTICS v_count = ROW_COUNT;
        EXCEPTION WHEN unique_violation THEN
            RAISE EXCEPTION 'key already taken in the next stage'
                USING ERRCODE = 'SK002',
                      DETAIL = pg_catalog.format('Task %s cannot move to stage %s: a live task there has the same key.',
                                                 finish.id, pg_catalog.quote_literal(finish.next_stage)),
                      HINT = 'Finish without next_stage, or cancel the other task first.';
        END;
        IF v_count = 1 AND v_counted THEN  -- the run's stage keeps no history of done runs
            PERFORM queue._count_runs(v_stage, 'done');
        END IF;
        IF v_count = 1 THEN
            IF v_next.notify
               AND EXISTS (SELECT 1 FROM queue.stage_waiters w WHERE w.stage = finish.next_stage AND w.until > v_now) THEN
                PERFORM queue._wake_waiters(finish.next_stage);  -- one NOTIFY per wait: it ends the mark
            END IF;
            RETURN true;
        END IF;
    END IF;

    -- Rare: the task was enqueued again with mode 'rerun' while it ran; run it again.
    UPDATE queue.live_tasks t
       SET status = 'ready', rerun = false, attempt = 0, lease = NULL, lease_expires = NULL,
           started = NULL, error_text = NULL, updated = v_now
     WHERE t.id = finish.id AND t.lease = finish.lease AND t.rerun
       AND (finish.stage IS NULL OR t.stage = finish.stage)
    RETURNING t.stage, t.run_at <= v_now INTO v_stage, v_due;
    IF FOUND THEN
        IF v_due THEN
            PERFORM queue._wake_waiters(v_stage);
        END IF;
        RETURN true;
    END IF;
    -- Nothing ended: a stale lease, or a periodic task asked to move on.
    IF finish.next_stage IS NOT NULL
       AND EXISTS (SELECT FROM queue.live_tasks t
                    WHERE t.id = finish.id AND t.lease = finish.lease AND t.repeat IS NOT NULL
                      AND (finish.stage IS NULL OR t.stage = finish.stage)) THEN
        PERFORM queue._raise_bad_argument('finish', 'next_stage, repeat', pg_catalog.jsonb_build_object('id', finish.id::text));
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION queue.finish(bigint, uuid, text, text, jsonb) IS 'Ends a running attempt successfully if lease is current: done (to queue.history, with result) or, with next_stage, queued ready there (result becomes its payload); a periodic task is recorded and re-armed. False, changing nothing, for a stale lease.';
REVOKE ALL ON FUNCTION queue.finish(bigint, uuid, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.finish(bigint, uuid, text, text, jsonb) TO skiplock_worker, skiplock_admin;
