-- reap_hung(): recover the tasks of workers that died or hang: every running task whose lease
-- expired becomes 'error' (retried per its stage's backoff, error text 'lease expired …') or, when
-- its attempts are used up, 'fatal' (moved to queue.history); one enqueued again with mode 'rerun'
-- while it ran is ready again from attempt 0. A periodic task out of attempts is recorded as fatal
-- and re-armed for its next slot, as fail() does. Returns how many it recovered, at most 10,000 a
-- call. FOR UPDATE SKIP LOCKED: many sessions may call it at once. Reads only the partial index of
-- running tasks, so calling it every second is cheap. Tasks due again at once wake their stage's
-- waiting workers. Locks and writes the rows it recovers (queue.live_tasks, queue.history).
CREATE OR REPLACE FUNCTION queue.reap_hung()
    RETURNS integer
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- The index, whatever the statistics say: on a live_tasks never analyzed the planner read the
    -- whole table for the expired leases and again for the join that moves them (as finish_batch).
    SET enable_seqscan = off
AS $$
DECLARE
    v_now   timestamptz := pg_catalog.now();
    v_count integer;
    v_due   text[];
    v_stage text;
    -- Citus: a statement that locks rows stays on one shard, so it runs once per stage with
    -- expired leases; on one server once for all (NULL: no stage filter).
    v_stages  text[] := ARRAY[NULL]::text[];
    v_of      text;
    v_part    integer;
    v_part_due text[];
BEGIN
    IF pg_catalog.current_setting('citus.version', true) IS NOT NULL THEN
        v_stages := ARRAY(SELECT DISTINCT l.stage FROM queue.live_tasks l
                           WHERE l.status = 'running' AND l.lease_expires < v_now);
    END IF;
    v_count := 0;
    v_due := '{}';
    FOREACH v_of IN ARRAY v_stages LOOP
    WITH expired AS (
        SELECT t.id,
               t.rerun OR t.attempt < (st.s).max_attempts AS retry,
               v_now + queue._retry_delay(st.s, t.attempt) AS retry_at,  -- not in the CASE below: Citus
               queue._bounded_error(pg_catalog.format('lease expired at %s (worker %s, attempt %s)',
                   t.lease_expires, coalesce(t.worker, 'unnamed'), t.attempt)) AS message
          FROM (SELECT l.id, l.stage, l.attempt, l.rerun, l.worker, l.lease_expires
                  FROM queue.live_tasks l
                 WHERE l.status = 'running' AND l.lease_expires < v_now
                   AND (v_of IS NULL OR l.stage = v_of)
                 ORDER BY l.lease_expires
                 LIMIT 10000
                   FOR UPDATE SKIP LOCKED) t
         -- The stage's settings, else '*' (queue._settings' rule), as a subquery: Citus runs no
         -- function that queries on a shard.
         CROSS JOIN LATERAL (SELECT (SELECT ROW(x.*)::queue.stage_settings FROM queue.stage_settings x
                                      WHERE x.stage IN (t.stage, '*')
                                      ORDER BY x.stage = '*' LIMIT 1) AS s) st
    ), gone AS (
        DELETE FROM queue.live_tasks t
         USING expired e
         WHERE t.id = e.id AND NOT e.retry AND t.repeat IS NULL AND (v_of IS NULL OR t.stage = v_of)
        RETURNING t AS task, e.message
    ), periodic AS (
        -- Periodic tasks out of attempts: the run is fatal, the schedule goes on. All parts of
        -- this statement see the rows as they were before it, so this reads the run's values.
        SELECT t AS task, e.message, queue._next_slot(t.slot, t.repeat, t.drift, v_now) AS next_slot
          FROM queue.live_tasks t
          JOIN expired e ON e.id = t.id
         WHERE NOT e.retry AND t.repeat IS NOT NULL AND (v_of IS NULL OR t.stage = v_of)
    ), rearmed AS (
        UPDATE queue.live_tasks t
           SET status = 'ready', attempt = 0, run_at = p.next_slot, slot = p.next_slot,
               lease = NULL, lease_expires = NULL, started = NULL, worker = NULL,
               error_text = NULL, updated = v_now
          FROM periodic p
         WHERE t.id = (p.task).id AND t.stage = (p.task).stage
    ), fatal AS (
        INSERT INTO queue.history
        SELECT (queue._history_row(f.task, 'fatal', (f.task).attempt, (f.task).worker, f.message, (f.task).started, v_now)).*
          FROM (SELECT g.task, g.message FROM gone g
                 -- what waits for it (rare): resolved by _end_waits, one test of a column already returned
                 WHERE CASE WHEN (g.task).waits < 0 THEN queue._end_waits((g.task).id, 'fatal') ELSE true END
                UNION ALL SELECT p.task, p.message FROM periodic p) f
        RETURNING 1
    ), retried AS (
        -- A task enqueued again with mode 'rerun' while it ran starts over as fail() would
        -- queue it: ready at the run_at the re-run asked for, from attempt 0, no backoff.
        UPDATE queue.live_tasks t
           SET status = CASE WHEN t.rerun THEN 'ready' ELSE 'error' END::queue.task_status_live,
               rerun = false,
               run_at = CASE WHEN t.rerun THEN t.run_at ELSE e.retry_at END,
               attempt = CASE WHEN t.rerun THEN 0 ELSE t.attempt END,
               lease = NULL, lease_expires = NULL,
               error_text = CASE WHEN t.rerun THEN NULL ELSE e.message END,  -- a re-run starts clean
               updated = v_now
          FROM expired e
         WHERE t.id = e.id AND e.retry AND (v_of IS NULL OR t.stage = v_of)
        RETURNING t.stage, t.run_at <= v_now AS due
    )
    SELECT ((SELECT pg_catalog.count(*) FROM fatal) + (SELECT pg_catalog.count(*) FROM retried))::integer,
           ARRAY(SELECT DISTINCT r.stage FROM retried r WHERE r.due)
      INTO v_part, v_part_due;
    v_count := v_count + v_part;
    v_due := v_due || v_part_due;
    END LOOP;
    -- Tasks due again at once (a re-run, a zero backoff) wake their stage's waiting workers.
    FOREACH v_stage IN ARRAY v_due LOOP
        PERFORM queue._wake_waiters(v_stage);
    END LOOP;
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION queue.reap_hung() IS 'Recovers running tasks whose lease expired (dead or hung workers): error with a retry per the stage''s backoff, or fatal when out of attempts (a periodic task is re-armed). Returns the count. SKIP LOCKED: safe from many sessions, cheap every second.';
REVOKE ALL ON FUNCTION queue.reap_hung() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.reap_hung() TO skiplock_admin;
