-- _next_stage(stages, after): the stage that follows `after` (NULL: the first) in the round robin
-- of a multi-stage take, in the stages' sort order: the least element of stages named outright,
-- or of the stages with waiting tasks (ready, error) that start with one of its prefixes ('x*'),
-- greater than after. NULL past the last. A prefix is followed by probing the claim index for the
-- next stage with waiting tasks, one probe a stage, at most 10,000 probes a call.
-- Reads queue.live_tasks; locks and writes nothing.
CREATE OR REPLACE FUNCTION queue._next_stage(stages text[], after text)
    RETURNS text
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_best     text;
    v_prefixes text[];
    v_probe    text := _next_stage.after;
BEGIN
    SELECT pg_catalog.min(e.e) FILTER (WHERE pg_catalog.right(e.e, 1) <> '*' AND (_next_stage.after IS NULL OR e.e > _next_stage.after)),
           pg_catalog.array_agg(pg_catalog.left(e.e, -1)) FILTER (WHERE pg_catalog.right(e.e, 1) = '*')
      INTO v_best, v_prefixes
      FROM pg_catalog.unnest(_next_stage.stages) AS e(e);
    IF v_prefixes IS NOT NULL THEN
        FOR v_probes IN 1..10000 LOOP
            v_probe := (SELECT pg_catalog.min(t.stage) FROM queue.live_tasks t
                         WHERE t.status IN ('ready', 'error') AND t.stage > coalesce(v_probe, ''));
            EXIT WHEN v_probe IS NULL OR v_probe >= v_best;
            IF EXISTS (SELECT FROM pg_catalog.unnest(v_prefixes) AS p(p) WHERE pg_catalog.starts_with(v_probe, p.p)) THEN
                RETURN v_probe;
            END IF;
        END LOOP;
    END IF;
    RETURN v_best;
END
$$;
COMMENT ON FUNCTION queue._next_stage(text[], text) IS 'Internal, for the multi-stage takes: the stage after a given one in their round robin, among the stages named and those with waiting tasks that match a prefix (''tenant.*''); NULL past the last.';
REVOKE ALL ON FUNCTION queue._next_stage(text[], text) FROM PUBLIC;
