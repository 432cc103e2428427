-- _claim_position(stage, now): where this session's next claim in the stage starts, from the text
-- in the session setting skiplock.claim_hint that _claim_hint wrote at its last claim there:
-- (priority, run_at, id) of the last task claimed and rescan_at, when to scan from the beginning
-- again (microseconds since the epoch, as text). All NULL, so from the beginning, when the setting
-- holds no position, another stage's, one past rescan_at, one set by hand, or when a due task of a
-- lower priority number waits. Its <claim position> block is the definition: take_next and
-- take_locked carry the same text inline, where a call costs more than the copy
-- (tests/py/test_one_way.py keeps them equal; docs/decisions.md, "The claim position, one definition").
-- Split, not regexp_match, whose capture groups cost more; the pattern and left() only guard the
-- casts. Reads queue.live_tasks; writes nothing.
CREATE OR REPLACE FUNCTION queue._claim_position(
        stage         text,
        now           timestamptz DEFAULT pg_catalog.now(),
        OUT priority  integer,
        OUT run_at    timestamptz,
        OUT id        bigint,
        OUT rescan_at text)
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now           timestamptz := _claim_position.now;
    v_setting       text;
    v_hint          text[];
    v_from_priority integer;
    v_from_run_at   timestamptz;
    v_from_micros   bigint;
    v_from_id       bigint;
    v_rescan_at     text;
BEGIN
    -- <claim position> (the definition: take_next and take_locked carry the same text)
    v_setting := pg_catalog.current_setting('skiplock.claim_hint', true);
    IF v_setting ~ '^-?[0-9]+/-?[0-9]+/[0-9]+/-?[0-9]+/' THEN
        v_hint          := pg_catalog.string_to_array(v_setting, '/');
        v_from_priority := pg_catalog.left(v_hint[1], 9)::integer;
        v_from_micros   := pg_catalog.left(v_hint[2], 17)::bigint;  -- within timestamptz's range
        v_from_id       := pg_catalog.left(v_hint[3], 18)::bigint;
        v_rescan_at     := pg_catalog.left(v_hint[4], 18);
    END IF;
    -- Compared whole (a stage may hold '/'): another stage's position, or a field left() cut, fails.
    IF v_setting = pg_catalog.concat_ws('/', v_from_priority, v_from_micros, v_from_id, v_rescan_at, _claim_position.stage)
       AND v_rescan_at::float8 > pg_catalog.date_part('epoch', v_now) * 1000000 THEN
        v_from_run_at   := timestamptz 'epoch' + v_from_micros * interval '1 microsecond';
        -- In claim order with LIMIT, not EXISTS: the generic plan of an EXISTS scans the table.
        IF (SELECT c.priority
              FROM queue.live_tasks c
             WHERE c.stage = _claim_position.stage
               AND c.status IN ('ready', 'error')
               AND c.run_as IS NULL
               AND c.priority < v_from_priority
               AND c.run_at <= v_now
             ORDER BY c.priority, c.run_at, c.id
             LIMIT 1) IS NOT NULL THEN
            v_from_priority := NULL;  -- a task of a lower priority number is due: from the beginning
        END IF;
    ELSE
        v_from_priority := NULL;  -- no position, or a stale one: from the beginning
    END IF;
    -- </claim position>
    IF v_from_priority IS NOT NULL THEN
        priority  := v_from_priority;
        run_at    := v_from_run_at;
        id        := v_from_id;
        rescan_at := v_rescan_at;
    END IF;
END
$$;
COMMENT ON FUNCTION queue._claim_position(text, timestamptz) IS 'Internal: where this session''s next claim in the stage starts (skiplock.claim_hint); all NULL for from the beginning. The definition of the claim position that take_next and take_locked carry inline.';
REVOKE ALL ON FUNCTION queue._claim_position(text, timestamptz) FROM PUBLIC;
