-- drain(stage, batch): consume() for a stage that one consumer at a time drains (a tenant's stage,
-- say): up to `batch` due tasks, take_next's order, recorded as done in queue.history by the same
-- statement as consume, in the caller's transaction. The stage is taken with a transaction-level
-- advisory lock, tried: while another transaction drains it, returns nothing at once (take another
-- stage). Holding it, the tasks are claimed without a row lock each: found by a plain read,
-- deleted by row address, the DELETE re-checking that each is still due and waiting (ready or
-- error). Beside the other calls on the same tasks: takes (take_next, take_locked, consume) skip
-- the tasks a drain deleted; a drain waits for a take, cancel or set_priority that holds a task,
-- then skips it if that transaction changed it (a task still waiting is left for the next call).
-- Nothing is drained twice, none lost. A rollback gives every task back. Periodic and SQL tasks
-- are left to take_next and run_sql_tasks; a paused stage: nothing; the checks and errors of
-- consume (22023, 42501, 0A000). Finding nothing due, it marks the stage as waited on.
-- Locks the stage's advisory lock and the rows it deletes; deletes from queue.live_tasks, inserts
-- into queue.history (a stage that keeps no history of done runs: counts them, queue.finished_counts).
CREATE OR REPLACE FUNCTION queue.drain(
        stage text    DEFAULT 'default',
        batch integer DEFAULT 100)
    RETURNS TABLE (id bigint, payload jsonb, attempt integer, priority integer, key text)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- One plan a session, as consume.
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_settings queue.stage_settings;
    v_minute   timestamptz;
    v_backend  integer;
    v_now         timestamptz := pg_catalog.now();
    v_bad text;    -- the first bad argument's name
BEGIN
    -- <take checks> (take_locked and consume: the same text, tests/py/test_one_way.py)
    IF drain.stage IS NULL OR drain.stage IN ('', '*') OR pg_catalog.octet_length(drain.stage) > 54
       OR drain.batch IS NULL OR drain.batch < 1 OR drain.batch > 10000 THEN
        v_bad := CASE WHEN drain.stage IS NULL OR drain.stage IN ('', '*') OR pg_catalog.octet_length(drain.stage) > 54
                      THEN 'stage'
                      WHEN drain.batch IS NULL OR drain.batch < 1 OR drain.batch > 10000 THEN 'batch' END;
        PERFORM queue._raise_bad_argument('drain', v_bad, pg_catalog.jsonb_build_object(
            'stage', drain.stage, 'batch', drain.batch::text));
    END IF;
    -- <settings> (the stage's row, else the defaults '*': the same text in _settings and its inline copies)
    v_settings := coalesce((SELECT s FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) drain.stage),
                           (SELECT s FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) '*'));
    -- </settings>
    IF v_settings.restricted THEN
        PERFORM queue._check_access(drain.stage, 'take');
    END IF;
    IF v_settings.max_running IS NOT NULL OR v_settings.group_limit IS NOT NULL OR v_settings.rate_limit IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('drain', 'limits', pg_catalog.jsonb_build_object('stage', drain.stage));
    END IF;
    IF v_settings.paused THEN
        RETURN;
    END IF;
    -- </take checks>
    -- One drainer a stage (class 1685217641, 'drai'): another one holding it means take another stage.
    IF NOT pg_catalog.pg_try_advisory_xact_lock(1685217641, pg_catalog.hashtext(drain.stage)) THEN
        RETURN;
    END IF;

    -- No FOR UPDATE: the DELETE locks only what it deletes. A task another transaction changed
    -- after the read is re-checked by the DELETE's WHERE once that transaction ends (READ COMMITTED):
    -- its new version has a new row address, and its state is tested again too.
    -- One statement a call, chosen by the stage's history mode (the tasks carry it from enqueue).
    IF v_settings.history IS NULL THEN
        RETURN QUERY
        WITH done AS (
            DELETE FROM queue.live_tasks t
             WHERE t.stage = drain.stage AND t.ctid = ANY (ARRAY(
                       SELECT c.ctid
                         FROM queue.live_tasks c
                        WHERE c.stage = drain.stage
                          AND c.status IN ('ready', 'error')
                          AND c.run_as IS NULL
                          AND c.repeat IS NULL
                          AND c.run_at <= v_now
                        ORDER BY c.priority, c.run_at, c.id
                        LIMIT drain.batch))
               AND t.status IN ('ready', 'error') AND t.run_at <= v_now AND t.run_as IS NULL AND t.repeat IS NULL
            RETURNING t.*
        ), recorded AS (
            INSERT INTO queue.history
            SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt + 1, NULL, d.error_text, v_now, pg_catalog.clock_timestamp())).*
              FROM done d
             -- what waits for it (rare): resolved by _end_waits, one test of a column already returned
             WHERE CASE WHEN d.waits < 0 THEN queue._end_waits(d.id, 'done') ELSE true END
            RETURNING 1
        )
        SELECT d.id, d.payload, d.attempt + 1, d.priority, d.key
          FROM done d
         ORDER BY d.priority, d.run_at, d.id;
    ELSE
        -- A stage that keeps no history of done runs: a task stamped so is deleted and counted.
        v_minute := queue._count_minute();
        v_backend := pg_catalog.pg_backend_pid();
        RETURN QUERY
        WITH done AS (
            DELETE FROM queue.live_tasks t
             WHERE t.stage = drain.stage AND t.ctid = ANY (ARRAY(
                       SELECT c.ctid
                         FROM queue.live_tasks c
                        WHERE c.stage = drain.stage
                          AND c.status IN ('ready', 'error')
                          AND c.run_as IS NULL
                          AND c.repeat IS NULL
                          AND c.run_at <= v_now
                        ORDER BY c.priority, c.run_at, c.id
                        LIMIT drain.batch))
               AND t.status IN ('ready', 'error') AND t.run_at <= v_now AND t.run_as IS NULL AND t.repeat IS NULL
            RETURNING t.*
        ), recorded AS (
            INSERT INTO queue.history
            SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt + 1, NULL, d.error_text, v_now, pg_catalog.clock_timestamp())).*
              FROM done d
             WHERE d.history IS NULL
            RETURNING 1
        ), counted AS (
            -- The runs not kept, one count a call (as _count_runs counts; its key from variables:
            -- on Citus no function runs inside a shard's statement).
            INSERT INTO queue.finished_counts AS c (stage, status, minute, backend, runs)
            SELECT drain.stage, 'done', v_minute, v_backend, pg_catalog.count(*)
              FROM done d
             WHERE d.history IS NOT NULL
             HAVING pg_catalog.count(*) > 0
            ON CONFLICT ON CONSTRAINT finished_counts_pkey DO UPDATE
               SET runs = c.runs OPERATOR(pg_catalog.+) excluded.runs
        )
        SELECT d.id, d.payload, d.attempt + 1, d.priority, d.key
          FROM done d
         -- what waits for it (rare): resolved by _end_waits, one test of a column already returned
         WHERE CASE WHEN d.waits < 0 THEN queue._end_waits(d.id, 'done') ELSE true END
         ORDER BY d.priority, d.run_at, d.id;
    END IF;
    -- Nothing due: the caller will wait on the stage's channel, so enqueues must NOTIFY.
    IF NOT FOUND THEN
        PERFORM queue._mark_waiting(drain.stage);
    END IF;
END
$$;
COMMENT ON FUNCTION queue.drain(text, integer) IS 'consume() for one consumer a stage: takes the stage''s advisory lock (busy: returns nothing at once), then records up to batch due tasks as done without a row lock each. Same order, checks and history as consume; a rollback gives them back.';
REVOKE ALL ON FUNCTION queue.drain(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.drain(text, integer) TO skiplock_worker, skiplock_admin;
