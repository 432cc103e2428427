-- worker_settings(stage): what a worker needs to know of a stage's settings, in one call: its
-- task_timeout (the time limit of one attempt, NULL for none; see task_timeout()) and whether it
-- is paused (configure_stage(paused => true): take_next hands out none of its tasks). Workers
-- read it when they start and every maintenance round: they enforce the time limit and log when
-- the stage is paused and resumed (a worker cannot read queue.stage_config). The stage's row,
-- else the defaults row '*' (queue._settings). Result: one row (task_timeout, paused).
-- Reads queue.stage_settings; locks and writes nothing. Raises 22004/22023 for a bad stage.
CREATE OR REPLACE FUNCTION queue.worker_settings(stage text, OUT task_timeout interval, OUT paused boolean)
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row queue.stage_settings;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN worker_settings.stage IS NULL OR worker_settings.stage IN ('', '*') OR pg_catalog.octet_length(worker_settings.stage) > 54 THEN 'stage' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('worker_settings', v_bad, pg_catalog.jsonb_build_object(
            'stage', worker_settings.stage));
    END IF;
    -- </arguments>
    v_row := queue._settings(worker_settings.stage);
    task_timeout := v_row.task_timeout;
    paused := v_row.paused;
END
$$;
COMMENT ON FUNCTION queue.worker_settings(text) IS 'The settings a worker of the stage needs: task_timeout (NULL for none) and paused. Workers read it every maintenance round. Raises 22004/22023 for a bad stage.';
REVOKE ALL ON FUNCTION queue.worker_settings(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.worker_settings(text) TO skiplock_worker, skiplock_admin;
