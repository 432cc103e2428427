-- task_timeout(stage): the time limit of one attempt of a stage's tasks (stage_settings.task_timeout,
-- set with configure_stage), or NULL when it has none. Workers read it when they start and every
-- maintenance round, then kill a command (or stop waiting for a handler) that runs longer and fail
-- its attempt. The stage's row, else the defaults row '*' (queue._settings). Reads
-- queue.stage_settings; locks and writes nothing. Raises 22004/22023 for a bad stage.
CREATE OR REPLACE FUNCTION queue.task_timeout(stage text)
    RETURNS interval
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN task_timeout.stage IS NULL OR task_timeout.stage IN ('', '*') OR pg_catalog.octet_length(task_timeout.stage) > 54 THEN 'stage' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('task_timeout', v_bad, pg_catalog.jsonb_build_object(
            'stage', task_timeout.stage));
    END IF;
    -- </arguments>
    RETURN (queue._settings(task_timeout.stage)).task_timeout;
END
$$;
COMMENT ON FUNCTION queue.task_timeout(text) IS 'The time limit of one attempt of the stage''s tasks (configure_stage(task_timeout => …)), NULL for none; workers enforce it. Raises 22004/22023 for a bad stage.';
REVOKE ALL ON FUNCTION queue.task_timeout(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.task_timeout(text) TO skiplock_worker, skiplock_admin;
