-- _history_stages(): the distinct stages of queue.history, one index probe a stage (a loose index
-- scan: min(stage) above the last one found), however many rows each holds. A loop of plain
-- queries rather than a recursive CTE, which Citus refuses on a distributed table.
-- For the view queue.metrics. Reads queue.history; locks nothing beyond that.
CREATE OR REPLACE FUNCTION queue._history_stages()
    RETURNS SETOF text
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_stage text := (SELECT pg_catalog.min(h.stage) FROM queue.history h);
BEGIN
    WHILE v_stage IS NOT NULL LOOP
        RETURN NEXT v_stage;
        v_stage := (SELECT pg_catalog.min(h.stage) FROM queue.history h WHERE h.stage > v_stage);
    END LOOP;
END
$$;
COMMENT ON FUNCTION queue._history_stages() IS 'Internal: the distinct stages of queue.history, one index probe a stage, for the view queue.metrics.';
REVOKE ALL ON FUNCTION queue._history_stages() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._history_stages() TO skiplock_monitor, skiplock_admin;
