-- _claim_position(stage, now): where this session's next claim in a stage starts, from the
-- session setting skiplock.claim_hint that its last claim left (see take_next, which keeps the
-- same logic inline). NULLs mean: from the stage's first entry. That is the answer when there is
-- no hint for this stage, when the hint's 5 s are up (a task may have landed behind it), or when
-- a task of a lower priority number is due. rescan_at is carried into the next hint unchanged.
-- Used by take_locked. Reads queue.live_tasks (the claim index); writes nothing.
CREATE OR REPLACE FUNCTION queue._claim_position(
        stage             text,
        now               timestamptz,
        OUT from_priority integer,
        OUT from_run_at   timestamptz,
        OUT from_id       bigint,
        OUT rescan_at     text)
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_setting text := pg_catalog.current_setting('skiplock.claim_hint', true);
    v_hint    text[];
BEGIN
    -- Split, not regexp_match with capture groups (see take_next). The pattern and the lengths
    -- only guard the casts: a value set by hand is ignored, not an error.
    IF v_setting ~ '^-?[0-9]+/-?[0-9]+/[0-9]+/-?[0-9]+/' THEN
        v_hint := pg_catalog.string_to_array(v_setting, '/');
    END IF;
    -- The stage may hold '/': compare it whole.
    IF v_setting = pg_catalog.concat_ws('/', v_hint[1], v_hint[2], v_hint[3], v_hint[4], _claim_position.stage)
       AND pg_catalog.length(pg_catalog.ltrim(v_hint[1], '-')) <= 9
       AND pg_catalog.length(pg_catalog.ltrim(v_hint[2], '-')) <= 18
       AND pg_catalog.length(v_hint[3]) <= 18
       AND pg_catalog.length(pg_catalog.ltrim(v_hint[4], '-')) <= 18
       AND v_hint[4]::bigint > (pg_catalog.date_part('epoch', _claim_position.now) * 1000000)::bigint THEN
        -- In claim order with LIMIT, not EXISTS: the generic plan of an EXISTS scans the table.
        IF (SELECT c.priority
              FROM queue.live_tasks c
             WHERE c.stage = _claim_position.stage
               AND c.status IN ('ready', 'error')
               AND c.priority < v_hint[1]::integer
               AND c.run_at <= _claim_position.now
             ORDER BY c.priority, c.run_at, c.id
             LIMIT 1) IS NULL THEN
            from_priority := v_hint[1]::integer;
            from_run_at   := timestamptz 'epoch' + v_hint[2]::bigint * interval '1 microsecond';
            from_id       := v_hint[3]::bigint;
            rescan_at     := v_hint[4];
        END IF;
    END IF;
END
$$;
COMMENT ON FUNCTION queue._claim_position(text, timestamptz) IS 'Internal: where this session''s next claim in a stage starts (priority, run_at, id) from its setting skiplock.claim_hint, and the time of its next full rescan; NULLs for a claim from the stage''s first entry (no hint for the stage, hint older than 5 s, or a lower priority number due). Used by take_locked.';
REVOKE ALL ON FUNCTION queue._claim_position(text, timestamptz) FROM PUBLIC;
