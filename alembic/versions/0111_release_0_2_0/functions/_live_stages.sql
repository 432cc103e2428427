-- _live_stages(): the distinct stages of queue.live_tasks, one probe a stage of each partial index
-- that leads with stage (waiting rows, running rows), however long the backlog. A loop of plain
-- queries rather than a recursive CTE, which Citus refuses on a distributed table.
-- For the view queue.stage_config. Reads queue.live_tasks; locks nothing beyond that.
CREATE OR REPLACE FUNCTION queue._live_stages()
    RETURNS SETOF text
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_stage text := LEAST((SELECT pg_catalog.min(t.stage) FROM queue.live_tasks t WHERE t.status IN ('ready', 'error')),
                          (SELECT pg_catalog.min(t.stage) FROM queue.live_tasks t WHERE t.status = 'running'));
BEGIN
    WHILE v_stage IS NOT NULL LOOP
        RETURN NEXT v_stage;
        v_stage := LEAST((SELECT pg_catalog.min(t.stage) FROM queue.live_tasks t
                           WHERE t.status IN ('ready', 'error') AND t.stage > v_stage),
                         (SELECT pg_catalog.min(t.stage) FROM queue.live_tasks t
                           WHERE t.status = 'running' AND t.stage > v_stage));
    END LOOP;
END
$$;
COMMENT ON FUNCTION queue._live_stages() IS 'Internal: the distinct stages of queue.live_tasks, one probe a stage of each partial index leading with stage, for the view queue.stage_config.';
REVOKE ALL ON FUNCTION queue._live_stages() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._live_stages() TO skiplock_monitor, skiplock_admin;
