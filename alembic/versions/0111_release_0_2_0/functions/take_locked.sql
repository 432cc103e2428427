-- take_locked(stage, batch): claim up to `batch` due tasks of a stage for the caller's own
-- transaction, returning each with the attempt it runs as. The claim is the row lock plus an entry,
-- signed with queue.fence_key, in the transaction-local setting skiplock.held. The worker
-- runs the task inside that transaction and ends it there with finish_locked or fail_locked.
-- Nothing is written at the take (no status, no lease): the task shows 'ready' while it runs.
-- Order, SKIP LOCKED and the claim position are take_next's; a later take in the same transaction
-- skips the tasks it holds. A rollback, a killed worker or a crash gives the task back at once, its
-- attempt not counted; a rolled-back savepoint undoes its takes. Call it inside BEGIN … COMMIT,
-- for short tasks: the open transaction holds back vacuum. Skips SQL tasks; a paused stage hands
-- out nothing; finding nothing due, it marks the stage as waited on (stage_waiters), as take_next does.
-- Raises 22004/22023 for a bad stage or batch, 0A000 for a stage with max_running, group_limit or rate_limit,
-- 42501 for a restricted stage. Locks the claimed rows until the transaction ends.
CREATE OR REPLACE FUNCTION queue.take_locked(
        stage text    DEFAULT 'default',
        batch integer DEFAULT 1)
    RETURNS TABLE (id bigint, payload jsonb, attempt integer, priority integer, key text)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- One generic plan per session, as in take_next.
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_settings queue.stage_settings;
    v_now           timestamptz := pg_catalog.now();
    v_setting       text;
    v_hint          text[];
    v_from_priority integer;
    v_from_run_at   timestamptz;
    v_from_micros   bigint;
    v_from_id       bigint;
    v_rescan_at     text;
    v_full          boolean := false;
    -- The tasks this transaction holds already ('<id>:<code>,' each), or NULL.
    v_held          text := NULLIF(pg_catalog.current_setting('skiplock.held', true), '');
    v_held_ids      bigint[];
    v_key           text;           -- queue.fence_key's, which signs the entries
    v_bad           text;  -- the first bad argument's name
BEGIN
    -- <take checks> (take_locked and consume: the same text, tests/py/test_one_way.py)
    IF take_locked.stage IS NULL OR take_locked.stage IN ('', '*') OR pg_catalog.octet_length(take_locked.stage) > 54
       OR take_locked.batch IS NULL OR take_locked.batch < 1 OR take_locked.batch > 10000 THEN
        v_bad := CASE WHEN take_locked.stage IS NULL OR take_locked.stage IN ('', '*') OR pg_catalog.octet_length(take_locked.stage) > 54
                      THEN 'stage'
                      WHEN take_locked.batch IS NULL OR take_locked.batch < 1 OR take_locked.batch > 10000 THEN 'batch' END;
        PERFORM queue._raise_bad_argument('take_locked', v_bad, pg_catalog.jsonb_build_object(
            'stage', take_locked.stage, 'batch', take_locked.batch::text));
    END IF;
    -- <settings> (the stage's row, else the defaults '*': the same text in _settings and its inline copies)
    v_settings := coalesce((SELECT s FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) take_locked.stage),
                           (SELECT s FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) '*'));
    -- </settings>
    IF v_settings.restricted THEN
        PERFORM queue._check_access(take_locked.stage, 'take');
    END IF;
    IF v_settings.max_running IS NOT NULL OR v_settings.group_limit IS NOT NULL OR v_settings.rate_limit IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('take_locked', 'limits', pg_catalog.jsonb_build_object('stage', take_locked.stage));
    END IF;
    IF v_settings.paused THEN
        RETURN;
    END IF;
    -- </take checks>

    -- Where to start: as take_next, where this session's last claim in the stage ended, so that
    -- a claim does not walk the index entries of the tasks finished since, which stay until
    -- vacuum removes them (and all of them while an old snapshot holds it back). The same logic
    -- as take_next's, inline: a helper function's call costs more than the copy.
    -- <claim position> (queue._claim_position's, the definition, inline: tests/py/test_one_way.py)
    v_setting := pg_catalog.current_setting('skiplock.claim_hint', true);
    IF v_setting ~ '^-?[0-9]+/-?[0-9]+/[0-9]+/-?[0-9]+/' THEN
        v_hint          := pg_catalog.string_to_array(v_setting, '/');
        v_from_priority := pg_catalog.left(v_hint[1], 9)::integer;
        v_from_micros   := pg_catalog.left(v_hint[2], 17)::bigint;  -- within timestamptz's range
        v_from_id       := pg_catalog.left(v_hint[3], 18)::bigint;
        v_rescan_at     := pg_catalog.left(v_hint[4], 18);
    END IF;
    -- Compared whole (a stage may hold '/'): another stage's position, or a field left() cut, fails.
    IF v_setting = pg_catalog.concat_ws('/', v_from_priority, v_from_micros, v_from_id, v_rescan_at, take_locked.stage)
       AND v_rescan_at::float8 > pg_catalog.date_part('epoch', v_now) * 1000000 THEN
        v_from_run_at   := timestamptz 'epoch' + v_from_micros * interval '1 microsecond';
        -- In claim order with LIMIT, not EXISTS: the generic plan of an EXISTS scans the table.
        IF (SELECT c.priority
              FROM queue.live_tasks c
             WHERE c.stage = take_locked.stage
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
    -- SQL tasks (run_as set) are run_sql_tasks', in a session of their role: skipped here. SKIP
    -- LOCKED does not skip this transaction's own locks: a later take skips what skiplock.held lists
    -- (as ids: an <> ALL filter keeps the planner's estimate, and so the index scan, of the claim).
    IF v_held IS NOT NULL THEN
        v_held_ids := ARRAY(SELECT pg_catalog.split_part(e, ':', 1)::bigint
                              FROM pg_catalog.unnest(pg_catalog.string_to_array(v_held, ',')) e
                             WHERE e <> '');
    END IF;
    SELECT k.key INTO v_key FROM queue.fence_key k;
    <<claim>>
    LOOP
        -- <claim from the beginning> (the same text in take_next and take_locked)
        IF v_from_priority IS NULL THEN
            v_from_priority := -2147483648;
            v_from_run_at   := timestamptz '-infinity';
            v_from_id       := 0;
            v_rescan_at     := ((pg_catalog.date_part('epoch', v_now) + 5) * 1000000)::bigint::text;
            v_full          := true;
        END IF;
        -- </claim from the beginning>
        -- Each claimed row, in claim order, passes a filter that records it (a filter is evaluated
        -- once per row, above the row lock): the claim position moves to it, and an entry for it,
        -- signed with the attempt and run_at it took, goes into the transaction-local
        -- skiplock.held, which finish_locked and fail_locked check (with the lock held then and
        -- the task unchanged); a rollback undoes both with the locks. The position is the last
        -- row the filter saw, at most the greatest claimed: a next claim starts there or earlier.
        RETURN QUERY
        SELECT c.id, c.payload, c.attempt, c.priority, c.key
          FROM (SELECT c.id, c.payload, c.attempt + 1 AS attempt, c.priority, c.key, c.run_at
                  FROM queue.live_tasks c
                 WHERE c.stage = take_locked.stage
                   AND c.status IN ('ready', 'error')
                   AND c.run_as IS NULL
                   AND c.run_at <= v_now
                   AND (v_held_ids IS NULL OR c.id <> ALL (v_held_ids))
                   AND (c.priority, c.run_at, c.id) >= (v_from_priority, v_from_run_at, v_from_id)
                 ORDER BY c.priority, c.run_at, c.id
                 LIMIT take_locked.batch
                   FOR UPDATE SKIP LOCKED) c
         WHERE
              -- <claim hint> (queue._claim_hint's, the definition, inline: tests/py/test_one_way.py)
              pg_catalog.set_config('skiplock.claim_hint',
                  CASE WHEN pg_catalog.isfinite(c.run_at)
                       THEN pg_catalog.concat_ws('/', c.priority, (EXTRACT(epoch FROM c.run_at) * 1000000)::bigint,
                                                 c.id, v_rescan_at, take_locked.stage)
                       ELSE '' END,
                  false)
              -- </claim hint>
              IS NOT NULL
           AND pg_catalog.set_config('skiplock.held',
                   pg_catalog.concat(pg_catalog.current_setting('skiplock.held', true),
                                     queue._held_entry(pg_catalog.concat(v_key, '/', c.attempt, '/', EXTRACT(epoch FROM c.run_at)),
                                                       pg_catalog.pg_current_xact_id(), c.id)),
                   true) IS NOT NULL
         ORDER BY c.priority, c.run_at, c.id;
        EXIT claim WHEN FOUND OR v_full;
        v_from_priority := NULL;  -- nothing due past the position: look from the beginning
    END LOOP;
    -- Nothing due: the caller will wait on the stage's channel, so enqueues must NOTIFY.
    IF NOT FOUND THEN
        PERFORM queue._mark_waiting(take_locked.stage);
    END IF;
END
$$;
COMMENT ON FUNCTION queue.take_locked(text, integer) IS 'Claims up to batch due tasks for the caller''s transaction: row lock plus a signed entry in the transaction-local setting skiplock.held, no lease. End each there with finish_locked or fail_locked; short tasks only. 0A000 for limited stages.';
REVOKE ALL ON FUNCTION queue.take_locked(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.take_locked(text, integer) TO skiplock_worker, skiplock_admin;

-- take_locked(stages, batch): take_locked from several stages, fairly: up to `batch` tasks for the
-- caller's transaction, each with the stage it came from, served as take_next(stages) serves them
-- (names and 'prefix*', round robin by weight from the session's last turn). A stage found by a
-- prefix is skipped when the caller may not take from it or it has limits; one named outright
-- raises as take_locked(stage) does. End each task with finish_locked or fail_locked, as usual.
-- Raises 22004/22023 for bad stages or batch, 0A000 on Citus, and what take_locked raises.
-- Locks the claimed rows until the transaction ends.
CREATE OR REPLACE FUNCTION queue.take_locked(
        stages text[],
        batch  integer DEFAULT 1)
    RETURNS TABLE (stage text, id bigint, payload jsonb, attempt integer, priority integer, key text)
    LANGUAGE sql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT t.stage, t.id, t.payload, t.attempt, t.priority, t.key
      FROM queue._take_turns('locked', take_locked.stages, take_locked.batch, NULL, NULL) t
$$;
COMMENT ON FUNCTION queue.take_locked(text[], integer) IS 'Claims up to batch due tasks from several stages (names, or prefixes such as ''tenant.*'') for the caller''s transaction, round robin by stage weight; each row names its stage. Prefix stages that are limited or not granted are skipped. 0A000 on Citus.';
REVOKE ALL ON FUNCTION queue.take_locked(text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.take_locked(text[], integer) TO skiplock_worker, skiplock_admin;
