-- finish_batch(id[], lease[], stage, result[]): finish many attempts in one call and one commit
-- (workers that take in batches). Pairs id[i] with lease[i] (and result[i], when result is given:
-- kept in the run's history row as finish(…, result) does; a NULL element stores none); pairs
-- whose lease is not current are skipped. Periodic tasks are recorded done and re-armed for their
-- next run, and tasks re-run while they ran are queued again, as finish() does. Returns how many
-- attempts it ended.
-- Raises 22004 for a NULL id or lease, 22023 for NULL or unequal arrays, too many pairs or a JSON
-- scalar result, 54000 for a result over 1 MiB. Locks the rows it finishes; writes
-- queue.live_tasks and queue.history (queue.finished_counts for a stage that keeps no such history).
-- stage, when given, is the tasks' stage (routes the call on Citus); tasks of others are skipped.
-- Finds each pair's task through the primary key, whatever the statistics say (see the SET clauses).
CREATE OR REPLACE FUNCTION queue.finish_batch(id bigint[], lease uuid[], stage text DEFAULT NULL,
                                              result jsonb[] DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- One plan a session, and one that probes the primary key for each pair: on a live_tasks never
    -- analyzed the generic plan read the whole table once for every call (418 ms for 100 pairs of
    -- a 40,000-task table). enable_seqscan off leaves the planner no cheaper way than the index.
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
AS $$
DECLARE
    v_now   timestamptz := pg_catalog.now();
    v_done  integer;
    v_task  queue.live_tasks;
    v_rerun integer;
    v_due   text[];
    v_stage text;
    v_results jsonb;  -- the results given, by task id
    v_minute  timestamptz := queue._count_minute();  -- the key of the runs counted (history 'none', 'failures')
    v_backend integer := pg_catalog.pg_backend_pid();
    v_bad   text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    -- A NULL pair would be skipped as stale, its task left running until reaped: as finish().
    v_bad := CASE WHEN finish_batch.id IS NULL OR finish_batch.lease IS NULL
                       OR pg_catalog.cardinality(finish_batch.id) <> pg_catalog.cardinality(finish_batch.lease)
                       OR EXISTS (SELECT FROM pg_catalog.unnest(finish_batch.id) i WHERE i IS NULL)
                       OR EXISTS (SELECT FROM pg_catalog.unnest(finish_batch.lease) l WHERE l IS NULL) THEN 'id, lease'
                  WHEN pg_catalog.cardinality(finish_batch.id) > 10000 THEN 'batch'
                  WHEN finish_batch.result IS NOT NULL THEN 'optional' END;
    IF v_bad IS NOT NULL THEN
        IF v_bad = 'optional' THEN  -- the results' tests, only when results are given
            v_bad := CASE WHEN pg_catalog.cardinality(finish_batch.result) <> pg_catalog.cardinality(finish_batch.id) THEN 'result'
                          WHEN EXISTS (SELECT FROM pg_catalog.unnest(finish_batch.result) AS r(r)
                                        WHERE pg_catalog.jsonb_typeof(r.r) NOT IN ('object', 'array')
                                           OR pg_catalog.pg_column_size(r.r) > 1048576
                                           OR pg_catalog.pg_column_compression(r.r) IS NOT NULL) THEN 'result[i]' END;
        END IF;
        IF v_bad IS NOT NULL THEN
            PERFORM queue._raise_bad_argument('finish_batch', v_bad, pg_catalog.jsonb_build_object(
                'id', finish_batch.id::text, 'lease', finish_batch.lease::text,
                'batch', pg_catalog.cardinality(finish_batch.id)::text, 'result', finish_batch.result::text));
        END IF;
    END IF;
    -- </arguments>
    IF finish_batch.result IS NOT NULL THEN
        v_results := (SELECT pg_catalog.jsonb_object_agg(r.id::text, r.result)
                        FROM ROWS FROM (pg_catalog.unnest(finish_batch.id), pg_catalog.unnest(finish_batch.result)) AS r(id, result)
                       WHERE r.result IS NOT NULL);
    END IF;

    WITH pairs AS (
        SELECT p.id, p.lease
          FROM ROWS FROM (pg_catalog.unnest(finish_batch.id), pg_catalog.unnest(finish_batch.lease)) AS p(id, lease)
    ), done AS (
        DELETE FROM queue.live_tasks t
         USING pairs p
         WHERE t.id = p.id AND t.lease = p.lease AND NOT t.rerun AND t.repeat IS NULL
           AND (finish_batch.stage IS NULL OR t.stage = finish_batch.stage)
        RETURNING t.*
    ), recorded AS (
        INSERT INTO queue.history
        SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt, d.worker, d.error_text, d.started, v_now,
                                   v_results -> d.id::text)).*
          FROM done d
         WHERE d.history IS NULL  -- the stages that keep history of done runs; the others are counted
        RETURNING 1
    ), counted AS (
        -- The runs not kept, one count a stage (as _count_runs counts; its key from variables:
        -- on Citus no function runs inside a shard's statement).
        INSERT INTO queue.finished_counts AS c (stage, status, minute, backend, runs)
        SELECT d.stage, 'done', v_minute, v_backend, pg_catalog.count(*)
          FROM done d
         WHERE d.history IS NOT NULL
         GROUP BY d.stage
        ON CONFLICT ON CONSTRAINT finished_counts_pkey DO UPDATE
           SET runs = c.runs OPERATOR(pg_catalog.+) excluded.runs
    )
    SELECT pg_catalog.count(*)::integer INTO v_done
      FROM done d
     -- what waits for it (rare): resolved by _end_waits, one test of a column already returned
     WHERE CASE WHEN d.waits < 0 THEN queue._end_waits(d.id, 'done') ELSE true END;

    IF v_done = pg_catalog.cardinality(finish_batch.id) THEN
        RETURN v_done;
    END IF;
    -- Periodic tasks: record the run, re-arm the same row for the next one (see finish).
    FOR v_task IN
        SELECT t.*
          FROM queue.live_tasks t
         WHERE (t.id, t.lease) IN (SELECT p.id, p.lease
                                     FROM ROWS FROM (pg_catalog.unnest(finish_batch.id),
                                                     pg_catalog.unnest(finish_batch.lease)) AS p(id, lease))
           AND NOT t.rerun AND t.repeat IS NOT NULL
           AND (finish_batch.stage IS NULL OR t.stage = finish_batch.stage)
           FOR UPDATE OF t
    LOOP
        PERFORM queue._rearm(v_task, 'done', v_task.attempt, v_task.worker, v_task.error_text, v_task.started, v_now,
                             v_results -> v_task.id::text);
        v_done := v_done + 1;
    END LOOP;
    IF v_done = pg_catalog.cardinality(finish_batch.id) THEN
        RETURN v_done;
    END IF;
    -- Tasks enqueued again with mode 'rerun' while they ran go back to ready; the stages of
    -- those due now wake their waiting workers.
    WITH again AS (
        UPDATE queue.live_tasks t
           SET status = 'ready', rerun = false, attempt = 0, lease = NULL, lease_expires = NULL,
               started = NULL, error_text = NULL, updated = v_now
          FROM ROWS FROM (pg_catalog.unnest(finish_batch.id), pg_catalog.unnest(finish_batch.lease)) AS p(id, lease)
         WHERE t.id = p.id AND t.lease = p.lease AND t.rerun
           AND (finish_batch.stage IS NULL OR t.stage = finish_batch.stage)
        RETURNING t.stage, t.run_at <= v_now AS due
    )
    SELECT (SELECT pg_catalog.count(*) FROM again)::integer,
           ARRAY(SELECT DISTINCT a.stage FROM again a WHERE a.due)
      INTO v_rerun, v_due;
    FOREACH v_stage IN ARRAY v_due LOOP
        PERFORM queue._wake_waiters(v_stage);
    END LOOP;
    RETURN v_done + v_rerun;
END
$$;
COMMENT ON FUNCTION queue.finish_batch(bigint[], uuid[], text, jsonb[]) IS 'Finishes many attempts at once: each (id[i], lease[i]) whose lease is current becomes done (to queue.history with result[i]; a periodic task is recorded and re-armed). Returns how many it ended; stale pairs are skipped.';
REVOKE ALL ON FUNCTION queue.finish_batch(bigint[], uuid[], text, jsonb[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.finish_batch(bigint[], uuid[], text, jsonb[]) TO skiplock_worker, skiplock_admin;
