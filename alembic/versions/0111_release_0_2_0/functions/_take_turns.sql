-- _take_turns(kind, stages, batch, lease_for, worker): the multi-stage takes (take_next, take_locked,
-- consume with stages text[]; kind 'next', 'locked' or 'consume'): up to `batch` tasks from the
-- stages in turn, each stage's turn serving up to its stage_settings.weight tasks through the
-- single-stage call, so that no stage's backlog starves another. The round robin goes on from the
-- session's last turn (setting skiplock.turn, '<served>/<stage>'): the stage of the last turn
-- while it has weight left, else the next (_next_stage), wrapping around; it stops when the batch
-- is full or a whole round took nothing. A stage named outright is taken as the single-stage call
-- would (42501 for a restricted one, 0A000 for a limited one with take_locked or consume); one
-- found by a prefix is skipped instead. Each empty stage is marked as waited on by its take.
-- Raises what _check_stages raises, 0A000 on Citus. Locks and writes what the single-stage calls do.
CREATE OR REPLACE FUNCTION queue._take_turns(
        kind      text,
        stages    text[],
        batch     integer,
        lease_for interval,
        worker    text)
    RETURNS TABLE (stage text, id bigint, payload jsonb, attempt integer, lease uuid, lease_expires timestamptz,
                   priority integer, key text)
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_turn     text[] := pg_catalog.regexp_match(pg_catalog.current_setting('skiplock.turn', true), '^([0-9]{1,4})/(.+)$');
    v_last     text := v_turn[2];           -- the stage of the session's last turn
    v_served   integer := v_turn[1]::integer; -- how many of its weight that turn served
    v_stage    text;
    v_after    text;
    v_first    text;
    v_done     integer;
    v_settings queue.stage_settings;
    v_quota    integer;
    v_taken    integer;
    v_left     integer := _take_turns.batch;
    v_round    integer := 0;                -- taken since the round began at v_first
    v_wrapped  boolean := false;            -- wrapped around since v_first
    v_skip     boolean;
    v_bad      text;                        -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN _take_turns.stages IS NULL OR pg_catalog.cardinality(_take_turns.stages) NOT BETWEEN 1 AND 1000
                       OR EXISTS (SELECT FROM pg_catalog.unnest(_take_turns.stages) AS e(e)
                                   WHERE e.e IS NULL OR e.e IN ('', '*') OR pg_catalog.octet_length(e.e) > 54) THEN 'stages'
                  WHEN _take_turns.batch IS NULL OR _take_turns.batch < 1 OR _take_turns.batch > 10000 THEN 'batch' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument(CASE _take_turns.kind WHEN 'next' THEN 'take_next' WHEN 'locked' THEN 'take_locked'
                                          ELSE 'consume' END, v_bad,
                                          pg_catalog.jsonb_build_object('stages', _take_turns.stages::text, 'batch', _take_turns.batch::text));
    END IF;
    -- </arguments>
    IF EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname = 'citus') THEN
        RAISE EXCEPTION 'multi-stage takes are not supported on Citus'
            USING ERRCODE = '0A000',
                  DETAIL = 'Stages are Citus''s distribution key: a take from several stages would cross shards.',
                  HINT = 'Take from one stage per call (a worker per stage, or a loop over the stages).';
    END IF;
    -- Go on with the last turn's stage while it has weight left and is still one of stages.
    IF v_last IS NOT NULL AND v_served < (queue._settings(v_last)).weight
       AND (v_last = ANY (_take_turns.stages)
            OR EXISTS (SELECT FROM pg_catalog.unnest(_take_turns.stages) AS e(e)
                        WHERE pg_catalog.right(e.e, 1) = '*' AND pg_catalog.starts_with(v_last, pg_catalog.left(e.e, -1)))) THEN
        v_stage := v_last;
        v_done := v_served;
    END IF;
    v_after := v_last;
    LOOP
        IF v_stage IS NULL THEN
            v_stage := queue._next_stage(_take_turns.stages, v_after);
            v_done := 0;
            IF v_stage IS NULL THEN  -- past the last stage: from the first again
                EXIT WHEN v_after IS NULL OR v_wrapped;
                v_wrapped := v_first IS NOT NULL;  -- twice in one round: the round's first stage is gone
                v_stage := queue._next_stage(_take_turns.stages, NULL);
                EXIT WHEN v_stage IS NULL;
            END IF;
        END IF;
        -- Back at the round's first stage: another round only if this one took something.
        IF v_stage = v_first THEN
            EXIT WHEN v_round = 0;
            v_round := 0;
            v_wrapped := false;
        END IF;
        v_first := coalesce(v_first, v_stage);
        v_settings := queue._settings(v_stage);
        v_skip := false;
        IF v_stage <> ALL (_take_turns.stages) THEN
            -- Found by a prefix: skipped where, named, its take would raise.
            IF _take_turns.kind <> 'next' AND (v_settings.max_running IS NOT NULL OR v_settings.group_limit IS NOT NULL
                                               OR v_settings.rate_limit IS NOT NULL) THEN
                v_skip := true;
            ELSIF v_settings.restricted THEN
                BEGIN
                    PERFORM queue._check_access(v_stage, 'take');
                EXCEPTION WHEN insufficient_privilege THEN
                    v_skip := true;
                END;
            END IF;
        END IF;
        IF NOT v_skip THEN
            v_quota := least(v_left, v_settings.weight - v_done);
            IF _take_turns.kind = 'next' THEN
                RETURN QUERY
                SELECT v_stage, t.id, t.payload, t.attempt, t.lease, t.lease_expires, t.priority, t.key
                  FROM queue.take_next(v_stage, v_quota, _take_turns.lease_for, _take_turns.worker) t;
            ELSIF _take_turns.kind = 'locked' THEN
                RETURN QUERY
                SELECT v_stage, t.id, t.payload, t.attempt, NULL::uuid, NULL::timestamptz, t.priority, t.key
                  FROM queue.take_locked(v_stage, v_quota) t;
            ELSE
                RETURN QUERY
                SELECT v_stage, t.id, t.payload, t.attempt, NULL::uuid, NULL::timestamptz, t.priority, t.key
                  FROM queue.consume(v_stage, v_quota) t;
            END IF;
            GET DIAGNOSTICS v_taken = ROW_COUNT;
            IF v_taken > 0 THEN
                -- A stage that gave less than its quota has no more now: its turn is over.
                PERFORM pg_catalog.set_config('skiplock.turn',
                    CASE WHEN v_taken < v_quota THEN v_settings.weight ELSE v_done + v_taken END || '/' || v_stage, false);
                v_left := v_left - v_taken;
                v_round := v_round + v_taken;
                EXIT WHEN v_left = 0;
            END IF;
        END IF;
        v_after := v_stage;
        v_stage := NULL;
    END LOOP;
END
$$;
COMMENT ON FUNCTION queue._take_turns(text, text[], integer, interval, text) IS 'Internal: the multi-stage take_next, take_locked and consume: up to batch tasks from the stages (names and ''prefix*'') in a weighted round robin that goes on from the session''s last turn.';
REVOKE ALL ON FUNCTION queue._take_turns(text, text[], integer, interval, text) FROM PUBLIC;
