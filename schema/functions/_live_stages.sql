-- _live_stages(): the stages of queue.live_tasks: each once, in order, from the two partial indexes
-- that lead with stage (ready and failed rows, running rows): a loose index scan in batches, as
-- _history_stages (its batch adapts the same way). A query merges the first entries after the
-- last stage found of each index, and keeps the first `batch` of the two: every entry before the
-- last one kept is among them, so no stage is missed. Then the stages of the tasks that wait for
-- others (in neither index; found by their queue.dependencies rows), which may repeat one listed.
-- A loop of plain queries rather than a recursive CTE, which Citus refuses on a distributed
-- table. For the view queue.stage_config (its UNION drops the repeats). Reads queue.live_tasks
-- and queue.dependencies; locks nothing beyond that.
CREATE OR REPLACE FUNCTION queue._live_stages()
    RETURNS SETOF text
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- One plan a session: the batch size varies, and a plan made for each size costs more than the read.
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_batch integer := 64;
    v_last  text := '';  -- sorts before every stage, and is none (_check_stage refuses it)
    v_rows  text[];
    v_found integer;
    v_stage text;
BEGIN
    LOOP
        v_rows := ARRAY(SELECT u.stage
                          FROM ((SELECT t.stage FROM queue.live_tasks t
                                  WHERE t.status IN ('ready', 'error') AND t.stage > v_last ORDER BY t.stage LIMIT v_batch)
                                UNION ALL
                                (SELECT t.stage FROM queue.live_tasks t
                                  WHERE t.status = 'running' AND t.stage > v_last ORDER BY t.stage LIMIT v_batch)) u
                         ORDER BY u.stage LIMIT v_batch);
        v_found := 0;
        FOREACH v_stage IN ARRAY v_rows LOOP  -- in order: a new stage differs from the one before
            IF v_stage <> v_last THEN
                RETURN NEXT v_stage;
                v_last := v_stage;
                v_found := v_found + 1;
            END IF;
        END LOOP;
        EXIT WHEN pg_catalog.cardinality(v_rows) < v_batch;  -- both indexes read to their end
        v_batch := CASE WHEN v_found * 2 > v_batch THEN LEAST(v_batch * 2, 4096) ELSE GREATEST(v_batch / 2, 2) END;
    END LOOP;
    RETURN QUERY SELECT w.stage FROM queue.live_tasks w WHERE w.id IN (SELECT d.task FROM queue.dependencies d)
                  GROUP BY w.stage;
END
$$;
COMMENT ON FUNCTION queue._live_stages() IS 'Internal: the stages of queue.live_tasks for the view queue.stage_config: those of ready, failed and running rows once each, in order (a loose index scan in batches), then those of tasks waiting for others (may repeat).';
REVOKE ALL ON FUNCTION queue._live_stages() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._live_stages() TO skiplock_monitor, skiplock_admin;
