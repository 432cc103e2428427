-- _end_waits(id, status): task id left queue.live_tasks as status (done, fatal, cancelled) and
-- something waited for it (live_tasks.waits -1), or it was waiting itself. Its own edges go;
-- each task that waited for it counts down (live_tasks.waits) and is ready at 0, from
-- GREATEST(its run_at, now); after a fatal or cancelled end, a task that waited for it with
-- after_failed => 'cancel' is cancelled instead (to queue.history, its error naming the task),
-- and what waited for that one is resolved in turn, as for any cancel. Workers waiting on a stage
-- where a task became due are woken (_wake_waiters).
-- Returns true, so that a finish statement calls it from a WHERE clause, for the rows whose
-- waits is -1, without a second statement for the others.
-- Locks the waiting tasks' rows in id order before their edges (as cancel does: no two ends wait
-- for each other), then counts down on them, so that the last two awaited tasks ending at once
-- are serialised on the row. Writes queue.dependencies, queue.live_tasks, queue.history (_end_run).
CREATE OR REPLACE FUNCTION queue._end_waits(id bigint, status queue.task_status)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now    timestamptz := pg_catalog.now();
    v_ended  bigint[] := ARRAY[_end_waits.id];   -- this task, then the tasks its end cancels
    v_failed boolean := _end_waits.status <> 'done';
    v_i      integer := 1;
    v_down   bigint[];
    v_cancel bigint[];
    v_task   queue.live_tasks;
    v_stage  text;
BEGIN
    DELETE FROM queue.dependencies d WHERE d.task = _end_waits.id;  -- it waited: it waits no more
    WHILE v_i <= pg_catalog.cardinality(v_ended) LOOP
        -- A waiting task's row before its edges, in every transaction (a cancel of it too), and
        -- rows in id order: no two ends wait for each other.
        PERFORM
           FROM queue.live_tasks t
          WHERE t.id IN (SELECT d.task FROM queue.dependencies d WHERE d.after = v_ended[v_i])
            AND t.status = 'waiting'
          ORDER BY t.id
            FOR UPDATE;
        WITH gone AS (
            DELETE FROM queue.dependencies d WHERE d.after = v_ended[v_i]
            RETURNING d.task, d.run_if_failed
        )
        SELECT pg_catalog.array_agg(g.task) FILTER (WHERE NOT v_failed OR g.run_if_failed),
               pg_catalog.array_agg(g.task) FILTER (WHERE v_failed AND NOT g.run_if_failed)
          INTO v_down, v_cancel
          FROM gone g;
        FOR v_stage IN
            WITH counted AS (
                UPDATE queue.live_tasks t
                   -- at 0: -1 when something waits for it (locked above, this snapshot sees every edge)
                   SET waits = CASE WHEN t.waits > 1 THEN t.waits - 1
                                    WHEN EXISTS (SELECT FROM queue.dependencies x WHERE x.after = t.id) THEN -1
                                    ELSE 0 END,
                       status = CASE WHEN t.waits = 1 THEN 'ready' ELSE 'waiting' END::queue.task_status_live,
                       run_at = CASE WHEN t.waits = 1 THEN GREATEST(t.run_at, v_now) ELSE t.run_at END,
                       updated = v_now
                 WHERE t.id = ANY (v_down) AND t.status = 'waiting'
                RETURNING t.stage, t.waits
            )
            SELECT DISTINCT c.stage FROM counted c WHERE c.waits <= 0
        LOOP
            PERFORM queue._wake_waiters(v_stage);
        END LOOP;
        FOR v_task IN
            DELETE FROM queue.live_tasks t
             WHERE t.id = ANY (v_cancel) AND t.status = 'waiting'
            RETURNING t.*
        LOOP
            PERFORM queue._end_run(v_task, 'cancelled', v_task.attempt, v_task.worker,
                                   queue._bounded_error(pg_catalog.format('task %s, which it waited for, ended %s',
                                                                          v_ended[v_i], CASE WHEN v_i = 1 THEN _end_waits.status
                                                                                             ELSE 'cancelled' END)),
                                   NULL, v_now);
            DELETE FROM queue.dependencies d WHERE d.task = v_task.id;
            v_ended := v_ended || v_task.id;  -- a waiting task's waits does not say whether something waits for it
        END LOOP;
        v_i := v_i + 1;
        v_failed := true;  -- the tasks after the first were cancelled
    END LOOP;
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue._end_waits(bigint, queue.task_status) IS 'Internal: a task something waited for ended (done, fatal, cancelled): what waited for it counts down and is ready at 0, or, after a failure under after_failed => ''cancel'', is cancelled. Called by the statements that end tasks.';
REVOKE ALL ON FUNCTION queue._end_waits(bigint, queue.task_status) FROM PUBLIC;
