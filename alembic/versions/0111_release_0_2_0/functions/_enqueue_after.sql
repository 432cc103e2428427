-- _enqueue_after(payload, stage, priority, run_at, key, mode, repeat, group_key, after,
-- after_failed): enqueue's path for a task that waits for others (enqueue(after => …)), after
-- enqueue checked the other arguments and the caller's right to the stage. The task waits
-- ('waiting', live_tasks.waits = how many of them are live) until every task of after has left
-- queue.live_tasks; each of those is marked (waits -1, unless it waits itself) and gets an edge in
-- queue.dependencies. One that already ended counts by its last history row: done has ended; fatal
-- or cancelled, under after_failed 'cancel', records the new task cancelled at once (its id is
-- still returned). A key of a live task of the stage returns that task's id, changing nothing.
-- Raises 22004 for a NULL in after; 22023 for an empty or too long after, an unknown after_failed,
-- repeat or mode 'rerun' with after; P0002 for a task of after found neither live nor in history
-- (never enqueued, or its history was rotated away); 0A000 on Citus. Locks the live tasks of after
-- (row locks, so a task held by take_locked's transaction makes this wait for it); writes
-- queue.live_tasks, queue.dependencies and, when it cancels at once, its end (_end_run).
CREATE OR REPLACE FUNCTION queue._enqueue_after(payload jsonb, stage text, priority integer, run_at timestamptz,
                                                key text, mode text, repeat interval, group_key text,
                                                after bigint[], after_failed text)
    RETURNS bigint
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := pg_catalog.now();
    v_after   bigint[];
    v_live    bigint[] := ARRAY[]::bigint[];
    v_found   bigint[];
    v_missing bigint[];
    v_failed  bigint;
    v_status  queue.task_status;
    v_id      bigint;
    v_task    queue.live_tasks;
    v_history text := (queue._settings(_enqueue_after.stage)).history;  -- stamped as enqueue stamps it
    v_bad     text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN pg_catalog.array_position(_enqueue_after.after, NULL) IS NOT NULL
                       OR pg_catalog.cardinality(_enqueue_after.after) NOT BETWEEN 1 AND 1000 THEN 'after'
                  WHEN _enqueue_after.after_failed IS NULL OR _enqueue_after.after_failed NOT IN ('cancel', 'run') THEN 'after_failed'
                  WHEN _enqueue_after.repeat IS NOT NULL OR _enqueue_after.mode = 'rerun' THEN 'repeat, mode' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('enqueue', v_bad, pg_catalog.jsonb_build_object(
            'after', _enqueue_after.after::text, 'after_failed', _enqueue_after.after_failed::text,
            'repeat', _enqueue_after.repeat::text, 'mode', _enqueue_after.mode));
    END IF;
    -- </arguments>
    IF EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname = 'citus') THEN
        RAISE EXCEPTION 'after is not supported on Citus'
            USING ERRCODE = '0A000',
                  DETAIL = 'A task and the tasks it waits for can live on different shards, which the end of one cannot write.',
                  HINT = 'Enqueue the task when the others have finished (finish(next_stage => …) for a linear pipeline).';
    END IF;
    v_after := ARRAY(SELECT DISTINCT a FROM pg_catalog.unnest(_enqueue_after.after) AS a ORDER BY a);

    -- The task waits for all of them until the lookups below say otherwise.
    LOOP
        INSERT INTO queue.live_tasks AS t (stage, status, priority, run_at, payload, key, created, updated,
                                           group_key, waits, history)
        VALUES (_enqueue_after.stage, 'waiting', _enqueue_after.priority, _enqueue_after.run_at,
                _enqueue_after.payload, _enqueue_after.key, v_now, v_now, _enqueue_after.group_key,
                pg_catalog.cardinality(v_after), v_history)
        ON CONFLICT (stage, key) WHERE key IS NOT NULL DO NOTHING
        RETURNING t.id INTO v_id;
        EXIT WHEN v_id IS NOT NULL;
        -- mode 'ignore': the live task of this key stays as it is (it may end meanwhile: try again).
        SELECT t.id INTO v_id
          FROM queue.live_tasks t
         WHERE t.stage = _enqueue_after.stage AND t.key = _enqueue_after.key;
        IF v_id IS NOT NULL THEN
            RETURN v_id;
        END IF;
    END LOOP;

    -- Mark and lock the live ones: their end, waiting for this transaction, then sees the mark. A
    -- task that finish(next_stage => …) moved while this waited is live again under its id, in a
    -- row only the next statement's snapshot sees: hence the second round. Rows in id order, as
    -- every end locks them (an awaited task before what waits for it): no two wait for each other.
    LOOP
        PERFORM
           FROM queue.live_tasks t
          WHERE t.id = ANY (v_after) AND NOT t.id = ANY (v_live) AND t.id <> v_id
          ORDER BY t.id
            FOR UPDATE;
        WITH marked AS (
            UPDATE queue.live_tasks t
               SET waits = CASE WHEN t.waits > 0 THEN t.waits ELSE -1 END
             WHERE t.id = ANY (v_after) AND NOT t.id = ANY (v_live) AND t.id <> v_id
            RETURNING t.id
        )
        SELECT pg_catalog.array_agg(m.id) INTO v_found FROM marked m;
        EXIT WHEN v_found IS NULL;
        v_live := v_live || v_found;
        EXIT WHEN pg_catalog.cardinality(v_live) = pg_catalog.cardinality(v_after);
    END LOOP;

    IF pg_catalog.cardinality(v_live) < pg_catalog.cardinality(v_after) THEN
        -- The others ended before: each one's last history row says how.
        WITH last AS (
            SELECT a.id, h.status
              FROM pg_catalog.unnest(v_after) AS a(id)
              LEFT JOIN LATERAL (SELECT x.status FROM queue.history x
                                  WHERE x.id = a.id
                                  ORDER BY x.finished DESC,
                                           CASE x.status WHEN 'cancelled' THEN 0 WHEN 'fatal' THEN 1 ELSE 2 END
                                  LIMIT 1) h ON true
             WHERE NOT a.id = ANY (v_live)
        )
        SELECT pg_catalog.array_agg(l.id ORDER BY l.id) FILTER (WHERE l.status IS NULL),
               (pg_catalog.array_agg(l.id ORDER BY l.id) FILTER (WHERE l.status <> 'done'))[1],
               (pg_catalog.array_agg(l.status ORDER BY l.id) FILTER (WHERE l.status <> 'done'))[1]
          INTO v_missing, v_failed, v_status
          FROM last l;
        IF v_missing IS NOT NULL THEN
            RAISE EXCEPTION 'task to wait for not found'
                USING ERRCODE = 'P0002',
                      DETAIL = pg_catalog.format('No live task and no history has id %s.',
                                                 pg_catalog.array_to_string(v_missing[1:10], ', ')
                                                 || CASE WHEN pg_catalog.cardinality(v_missing) > 10
                                                         THEN pg_catalog.format(' (and %s more)', pg_catalog.cardinality(v_missing) - 10) ELSE '' END),
                      HINT = 'Wait only for tasks that exist; a finished task is known while its history is kept (configure_history).';
        END IF;
        IF v_failed IS NOT NULL AND _enqueue_after.after_failed = 'cancel' THEN
            DELETE FROM queue.live_tasks t WHERE t.id = v_id AND t.stage = _enqueue_after.stage
            RETURNING t.* INTO v_task;
            PERFORM queue._end_run(v_task, 'cancelled', 0, NULL,
                                   pg_catalog.format('task %s, which it waited for, ended %s', v_failed, v_status),
                                   NULL, v_now);
            RETURN v_id;
        END IF;
        UPDATE queue.live_tasks t
           SET waits = pg_catalog.cardinality(v_live),
               status = CASE WHEN pg_catalog.cardinality(v_live) = 0 THEN 'ready' ELSE 'waiting' END::queue.task_status_live
         WHERE t.id = v_id AND t.stage = _enqueue_after.stage;
        IF pg_catalog.cardinality(v_live) = 0 THEN
            IF _enqueue_after.run_at <= v_now THEN
                PERFORM queue._wake_waiters(_enqueue_after.stage);
            END IF;
            RETURN v_id;
        END IF;
    END IF;
    INSERT INTO queue.dependencies (task, after, run_if_failed)
    SELECT v_id, l, _enqueue_after.after_failed = 'run'
      FROM pg_catalog.unnest(v_live) AS l;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION queue._enqueue_after(jsonb, text, integer, timestamptz, text, text, interval, text, bigint[], text) IS 'Internal, for enqueue(after => …): adds a task that waits until the given tasks have ended (resolving those already in history), with the after_failed policy.';
REVOKE ALL ON FUNCTION queue._enqueue_after(jsonb, text, integer, timestamptz, text, text, interval, text, bigint[], text) FROM PUBLIC;
