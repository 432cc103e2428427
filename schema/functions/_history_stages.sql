-- _history_stages(): the distinct stages of queue.history, in order: a loose index scan that reads
-- a batch of the (stage, finished) index's entries a query, from after the last stage found. The
-- batch adapts: it doubles (to 4,096 entries) while more than half of a batch's entries are new
-- stages (many stages of a run or two each: up to 4,096 stages a query) and halves (to 2)
-- otherwise, where it costs what one probe a stage did (docs/decisions.md, "The stage lists read
-- the index in batches that adapt"). A loop of plain queries rather than a recursive CTE, which
-- Citus refuses on a distributed table. For the views queue.metrics and queue.hourly and for
-- _roll_up_hours. Reads queue.history; locks nothing beyond that.
CREATE OR REPLACE FUNCTION queue._history_stages()
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
        v_rows := ARRAY(SELECT h.stage FROM queue.history h WHERE h.stage > v_last ORDER BY h.stage LIMIT v_batch);
        v_found := 0;
        FOREACH v_stage IN ARRAY v_rows LOOP  -- in order: a new stage differs from the one before
            IF v_stage <> v_last THEN
                RETURN NEXT v_stage;
                v_last := v_stage;
                v_found := v_found + 1;
            END IF;
        END LOOP;
        -- A short batch read the index to its end; a full one may end inside a stage, which the next skips.
        EXIT WHEN pg_catalog.cardinality(v_rows) < v_batch;
        v_batch := CASE WHEN v_found * 2 > v_batch THEN LEAST(v_batch * 2, 4096) ELSE GREATEST(v_batch / 2, 2) END;
    END LOOP;
END
$$;
COMMENT ON FUNCTION queue._history_stages() IS 'Internal: the distinct stages of queue.history in order, by a loose index scan in batches (2 to 4,096 index entries a query), for the views queue.metrics and queue.hourly.';
REVOKE ALL ON FUNCTION queue._history_stages() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._history_stages() TO skiplock_monitor, skiplock_admin;
