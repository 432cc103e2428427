-- consume(stage, batch): take up to `batch` due tasks of a stage and record them as done, in one
-- statement and in the caller's transaction, for work done inside the database or whose result
-- the caller writes in that same transaction: no lease, no finish call.
-- Order and FOR UPDATE SKIP LOCKED as take_next; a rollback gives every task back, ready, its
-- attempt not counted. Returns the tasks with the attempt they ran as.
-- Periodic tasks (repeat) and SQL tasks (enqueue_sql) are left to take_next and run_sql_tasks.
-- A paused stage returns nothing; a restricted one raises 42501 unless the caller may take; a
-- stage with max_running, group_limit or rate_limit raises 0A000 (consumed tasks never run, so they cannot
-- count). Finding nothing due, it marks the stage as waited on, as take_next.
-- Locks the claimed rows; deletes them from queue.live_tasks, inserts them into queue.history (a
-- stage that keeps no history of done runs: counts them, queue.finished_counts).
CREATE OR REPLACE FUNCTION queue.consume(
        stage text    DEFAULT 'default',
        batch integer DEFAULT 100)
    RETURNS TABLE (id bigint, payload jsonb, attempt integer, priority integer, key text)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- One plan a session: with LIMIT batch unknown the plan cache planned every call again.
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
    IF consume.stage IS NULL OR consume.stage IN ('', '*') OR pg_catalog.octet_length(consume.stage) > 54
       OR consume.batch IS NULL OR consume.batch < 1 OR consume.batch > 10000 THEN
        v_bad := CASE WHEN consume.stage IS NULL OR consume.stage IN ('', '*') OR pg_catalog.octet_length(consume.stage) > 54
                      THEN 'stage'
                      WHEN consume.batch IS NULL OR consume.batch < 1 OR consume.batch > 10000 THEN 'batch' END;
        PERFORM queue._raise_bad_argument('consume', v_bad, pg_catalog.jsonb_build_object(
            'stage', consume.stage, 'batch', consume.batch::text));
    END IF;
    -- <settings> (the stage's row, else the defaults '*': the same text in _settings and its inline copies)
    v_settings := coalesce((SELECT s FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) consume.stage),
                           (SELECT s FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) '*'));
    -- </settings>
    IF v_settings.restricted THEN
        PERFORM queue._check_access(consume.stage, 'take');
    END IF;
    IF v_settings.max_running IS NOT NULL OR v_settings.group_limit IS NOT NULL OR v_settings.rate_limit IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('consume', 'limits', pg_catalog.jsonb_build_object('stage', consume.stage));
    END IF;
    IF v_settings.paused THEN
        RETURN;
    END IF;
    -- </take checks>

    -- The claimed rows by their row address: locked, they cannot move before the DELETE, which
    -- then reads them directly instead of joining on the key.
    -- One statement a call, chosen by the stage's history mode (the tasks carry it from enqueue).
    IF v_settings.history IS NULL THEN
        RETURN QUERY
        WITH done AS (
            DELETE FROM queue.live_tasks t
             WHERE t.stage = consume.stage AND t.ctid = ANY (ARRAY(
                       SELECT c.ctid
                         FROM queue.live_tasks c
                        WHERE c.stage = consume.stage
                          AND c.status IN ('ready', 'error')
                          AND c.run_as IS NULL
                          AND c.repeat IS NULL
                          AND c.run_at <= v_now
                        ORDER BY c.priority, c.run_at, c.id
                        LIMIT consume.batch
                          FOR UPDATE SKIP LOCKED))
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
             WHERE t.stage = consume.stage AND t.ctid = ANY (ARRAY(
                       SELECT c.ctid
                         FROM queue.live_tasks c
                        WHERE c.stage = consume.stage
                          AND c.status IN ('ready', 'error')
                          AND c.run_as IS NULL
                          AND c.repeat IS NULL
                          AND c.run_at <= v_now
                        ORDER BY c.priority, c.run_at, c.id
                        LIMIT consume.batch
                          FOR UPDATE SKIP LOCKED))
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
            SELECT consume.stage, 'done', v_minute, v_backend, pg_catalog.count(*)
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
        PERFORM queue._mark_waiting(consume.stage);
    END IF;
END
$$;
COMMENT ON FUNCTION queue.consume(text, integer) IS 'Takes up to batch due tasks of a stage (take_next''s order, SKIP LOCKED), moves them to queue.history as done in one statement, in the caller''s transaction: a rollback gives them back. For work done in that transaction. Skips periodic and SQL tasks.';
REVOKE ALL ON FUNCTION queue.consume(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.consume(text, integer) TO skiplock_worker, skiplock_admin;

-- consume(stages, batch): consume from several stages, fairly: up to `batch` due tasks recorded as
-- done in the caller's transaction, each with the stage it came from, served as take_next(stages)
-- serves them (names and 'prefix*', round robin by weight from the session's last turn). A stage
-- found by a prefix is skipped when the caller may not take from it or it has limits; one named
-- outright raises as consume(stage) does. Raises 22004/22023 for bad stages or batch, 0A000 on
-- Citus, and what consume raises. Locks and writes what consume does.
CREATE OR REPLACE FUNCTION queue.consume(
        stages text[],
        batch  integer DEFAULT 100)
    RETURNS TABLE (stage text, id bigint, payload jsonb, attempt integer, priority integer, key text)
    LANGUAGE sql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT t.stage, t.id, t.payload, t.attempt, t.priority, t.key
      FROM queue._take_turns('consume', consume.stages, consume.batch, NULL, NULL) t
$$;
COMMENT ON FUNCTION queue.consume(text[], integer) IS 'Consumes up to batch due tasks from several stages (names, or prefixes such as ''tenant.*''), round robin by stage weight; each row names its stage. Prefix stages that are limited or not granted are skipped. 0A000 on Citus.';
REVOKE ALL ON FUNCTION queue.consume(text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.consume(text[], integer) TO skiplock_worker, skiplock_admin;
