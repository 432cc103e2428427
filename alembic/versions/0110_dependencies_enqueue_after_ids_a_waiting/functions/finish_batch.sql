-- finish_batch(id[], lease[], stage): finish many attempts in one call and one commit (workers that take
-- in batches). Pairs id[i] with lease[i]; pairs whose lease is not current are skipped. Periodic
-- tasks are recorded done and re-armed for their next run, and tasks re-run while they ran are
-- queued again, as finish() does. Returns how many attempts it ended.
-- Raises 22004 for a NULL element, 22023 for NULL or unequal arrays or too many
-- pairs. Locks the rows it finishes; writes queue.live_tasks and queue.history.
-- stage, when given, is the tasks' stage (routes the call on Citus); tasks of others are skipped.
-- Finds each pair's task through the primary key, whatever the statistics say (see the SET clauses).
CREATE OR REPLACE FUNCTION queue.finish_batch(id bigint[], lease uuid[], stage text DEFAULT NULL)
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
BEGIN
    IF finish_batch.id IS NULL OR finish_batch.lease IS NULL
       OR pg_catalog.cardinality(finish_batch.id) <> pg_catalog.cardinality(finish_batch.lease) THEN
        RAISE EXCEPTION 'id and lease must be arrays of the same length'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s ids, %s leases.',
                                             coalesce(pg_catalog.cardinality(finish_batch.id)::text, 'NULL'),
                                             coalesce(pg_catalog.cardinality(finish_batch.lease)::text, 'NULL')),
                  HINT = 'Pass the ids and leases take_next returned, in the same order.';
    END IF;
    -- A NULL pair would be skipped as stale, its task left running until reaped: as finish().
    IF EXISTS (SELECT 1 FROM pg_catalog.unnest(finish_batch.id) i WHERE i IS NULL)
       OR EXISTS (SELECT 1 FROM pg_catalog.unnest(finish_batch.lease) l WHERE l IS NULL) THEN
        RAISE EXCEPTION 'id and lease must not contain NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('%s NULL ids, %s NULL leases.',
                                             (SELECT pg_catalog.count(*) FROM pg_catalog.unnest(finish_batch.id) i WHERE i IS NULL),
                                             (SELECT pg_catalog.count(*) FROM pg_catalog.unnest(finish_batch.lease) l WHERE l IS NULL)),
                  HINT = 'Pass the ids and leases take_next returned, in the same order. Nothing was finished.';
    END IF;
    IF pg_catalog.cardinality(finish_batch.id) > 10000 THEN
        RAISE EXCEPTION 'batch out of range'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s tasks.', pg_catalog.cardinality(finish_batch.id)),
                  HINT = 'Finish at most 10000 tasks per call.';
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
    )
    INSERT INTO queue.history
    SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt, d.worker, d.error_text, d.started, v_now)).*
      FROM done d
     -- what waits for it (rare): resolved by _end_waits, one test of a column already returned
     WHERE CASE WHEN d.waits < 0 THEN queue._end_waits(d.id, 'done') ELSE true END;
    GET DIAGNOSTICS v_done = ROW_COUNT;

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
        PERFORM queue._rearm(v_task, 'done', v_task.attempt, v_task.worker, v_task.error_text, v_task.started, v_now);
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
COMMENT ON FUNCTION queue.finish_batch(bigint[], uuid[], text) IS 'Finishes many attempts at once: each (id[i], lease[i]) whose lease is current becomes done (moved to queue.history; a periodic task is recorded done and re-armed). Returns how many it ended; stale pairs are skipped. Locks the rows it finishes.';
REVOKE ALL ON FUNCTION queue.finish_batch(bigint[], uuid[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.finish_batch(bigint[], uuid[], text) TO skiplock_worker, skiplock_admin;
