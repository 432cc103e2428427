-- reap_hung(): recover the tasks of workers that died or hang: every running task whose lease
-- expired becomes 'error' (retried per its stage's backoff, error text 'lease expired …') or, when
-- its attempts are used up, 'fatal' (to queue.history; a periodic task is recorded and re-armed);
-- one enqueued again with mode 'rerun' while it ran is ready again from attempt 0. Returns how
-- many it recovered, at most 10,000 a call. FOR UPDATE SKIP LOCKED: many sessions may call it at
-- once; reads only the partial index of running tasks. Tasks due again wake their stage's workers.
-- Across a jump of the clock, time nobody saw pass does not count: when queue.reaper_clock (this
-- function's last record of now()) is over 2 minutes old, the last gap of over 2 minutes between
-- it, the take times of running tasks and now() is taken out of every lease that ran out within
-- it (each keeps the time it had left when the gap began), so a worker alive across it can
-- heartbeat on the new clock; a move back only makes leases longer. While another session records
-- such a gap this call reaps nothing. Locks and writes the rows it recovers (queue.live_tasks,
-- queue.history; queue.finished_counts for a stage that keeps none) and queue.reaper_clock (at
-- most every 10 s).
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
    v_minute  timestamptz := queue._count_minute();  -- the key of the runs counted (history 'none')
    v_backend integer := pg_catalog.pg_backend_pid();
    v_count integer;
    v_due   text[];
    v_stage text;
    -- Citus: a statement that locks rows stays on one shard, so it runs once per stage with
    -- expired leases; on one server once for all (NULL: no stage filter).
    v_stages  text[] := ARRAY[NULL]::text[];
    v_of      text;
    v_part    integer;
    v_part_due text[];
    -- A time longer than this with nothing seen (no record of the clock, no take) is a gap, not
    -- time the workers had to heartbeat in (maintain() runs every second or every minute).
    v_tolerance CONSTANT interval := interval '2 minutes';
    v_clock_key CONSTANT bigint := pg_catalog.hashtextextended('skiplock.reaper_clock', 0);
    v_last    timestamptz;
    v_at      timestamptz;
    v_gap_from timestamptz;  -- the last gap: leases that ran out within it are extended by it
    v_gap_to   timestamptz;
BEGIN
    SELECT c.observed INTO v_last FROM queue.reaper_clock c;
    IF v_last IS NULL OR v_now < v_last OR v_now - v_last >= interval '10 seconds' THEN
        IF NOT pg_catalog.pg_try_advisory_xact_lock(v_clock_key) THEN
            -- Another session records the clock: after a gap, it extends the leases first.
            IF v_now - v_last > v_tolerance THEN
                RETURN 0;
            END IF;
        ELSE
            SELECT c.observed INTO v_last FROM queue.reaper_clock c;  -- again, holding the lock
            IF v_now - v_last > v_tolerance THEN
                -- The takes since the record are times seen too: find the last gap between them.
                FOR v_at IN
                    SELECT l.updated FROM queue.live_tasks l
                     WHERE l.status = 'running' AND l.updated > v_last AND l.updated <= v_now
                     ORDER BY l.updated
                LOOP
                    IF v_at - v_last > v_tolerance THEN
                        v_gap_from := v_last;
                        v_gap_to := v_at;
                    END IF;
                    v_last := v_at;
                END LOOP;
                IF v_now - v_last > v_tolerance THEN
                    v_gap_from := v_last;
                    v_gap_to := v_now;
                END IF;
            END IF;
            UPDATE queue.reaper_clock c SET observed = v_now;
        END IF;
    END IF;
    IF pg_catalog.current_setting('citus.version', true) IS NOT NULL THEN
        v_stages := ARRAY(SELECT DISTINCT l.stage FROM queue.live_tasks l
                           WHERE l.status = 'running' AND l.lease_expires < v_now);
    END IF;
    v_count := 0;
    v_due := '{}';
    FOREACH v_of IN ARRAY v_stages LOOP
    IF v_gap_from IS NOT NULL THEN
        UPDATE queue.live_tasks t
           SET lease_expires = g.until
          FROM (SELECT l.id, l.stage, v_gap_to + (l.lease_expires - v_gap_from) AS until
                  FROM queue.live_tasks l
                 WHERE l.status = 'running' AND l.lease_expires >= v_gap_from AND l.lease_expires < v_gap_to
                   AND (v_of IS NULL OR l.stage = v_of)
                   FOR UPDATE SKIP LOCKED) g
         WHERE t.id = g.id AND t.stage = g.stage;
    END IF;
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
                 -- what waits for it (rare): resolved by _end_waits, one test of a column already returned;
                 -- then, in the same expression (so it is never skipped), the history mode
                 WHERE CASE WHEN CASE WHEN (g.task).waits < 0 THEN queue._end_waits((g.task).id, 'fatal') ELSE true END
                            THEN (g.task).history IS DISTINCT FROM 'none' END
                UNION ALL SELECT p.task, p.message FROM periodic p WHERE (p.task).history IS DISTINCT FROM 'none') f
        RETURNING 1
    ), counted AS (
        -- A stage that keeps no history ('none'): the fatal runs counted, one row a stage (as
        -- _count_runs counts; its key from variables: on Citus no function runs inside a shard's statement).
        INSERT INTO queue.finished_counts AS c (stage, status, minute, backend, runs)
        SELECT (f.task).stage, 'fatal', v_minute, v_backend, pg_catalog.count(*)
          FROM (SELECT g.task FROM gone g UNION ALL SELECT p.task FROM periodic p) f
         WHERE (f.task).history = 'none'
         GROUP BY (f.task).stage
        ON CONFLICT ON CONSTRAINT finished_counts_pkey DO UPDATE
           SET runs = c.runs OPERATOR(pg_catalog.+) excluded.runs
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
    SELECT ((SELECT pg_catalog.count(*) FROM gone) + (SELECT pg_catalog.count(*) FROM periodic)
            + (SELECT pg_catalog.count(*) FROM retried))::integer,
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
