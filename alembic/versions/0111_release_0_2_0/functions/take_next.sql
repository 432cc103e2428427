-- take_next(stage, batch, lease_for, worker): claim up to `batch` due tasks of a stage: waiting
-- tasks (ready, or error with a due retry) in order of priority (lower first), run_at, id, FOR
-- UPDATE SKIP LOCKED, so concurrent callers get disjoint tasks and never wait on each other. Each
-- starts a new attempt with a fresh lease token, valid for lease_for or the stage's lease_duration.
-- In a stage with max_running, group_limit or rate_limit, takers are serialised by a
-- transaction-level advisory lock on the stage, so that counting (running tasks, or the takes in
-- queue.rate_windows) and claiming are one step (take in short transactions, READ COMMITTED).
-- A session starts its claim where its last one in the stage ended (setting skiplock.claim_hint):
-- exact across priorities; within one, a task landing behind is taken within 5 s. Skips SQL
-- tasks; a paused stage hands out nothing. Finding nothing due, it marks the stage as waited on
-- (stage_waiters), which turns on enqueue's NOTIFY for a minute.
-- Raises 22004/22023 for a bad stage, batch, lease_for or worker, 42501 for a restricted stage.
-- Locks the claimed rows (and the stage's advisory lock); writes queue.live_tasks (and
-- queue.rate_windows).
CREATE OR REPLACE FUNCTION queue.take_next(
        stage     text     DEFAULT 'default',
        batch     integer  DEFAULT 1,
        lease_for interval DEFAULT NULL,
        worker    text     DEFAULT NULL)
    RETURNS TABLE (id bigint, payload jsonb, attempt integer, lease uuid, lease_expires timestamptz,
                   priority integer, key text)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- Plan each statement once per session: a custom plan for every call cost a third of a take.
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_settings queue.stage_settings;
    v_now      timestamptz := pg_catalog.now();
    v_lease    interval    := take_next.lease_for;
    v_running  integer;
    v_setting       text;
    v_hint          text[];
    v_from_priority integer;
    v_from_run_at   timestamptz;
    v_from_micros   bigint;
    v_from_id       bigint;
    v_rescan_at     text;
    v_full          boolean := false;
    -- One random value per call, a distinct lease per task from it: Citus refuses VOLATILE calls in an UPDATE.
    v_lease_seed    text := pg_catalog.gen_random_uuid()::text;
    v_bad           text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    -- The hot path evaluates only the guard, the CASE's tests joined by OR (a text CASE costs
    -- more a call: docs/decisions.md); tests/py/test_one_way.py keeps the two the same.
    IF take_next.stage IS NULL OR take_next.stage IN ('', '*') OR pg_catalog.octet_length(take_next.stage) > 54
       OR take_next.batch IS NULL OR take_next.batch < 1 OR take_next.batch > 10000
       OR v_lease <= interval '0' OR pg_catalog.length(take_next.worker) > 200 THEN
        v_bad := CASE WHEN take_next.stage IS NULL OR take_next.stage IN ('', '*') OR pg_catalog.octet_length(take_next.stage) > 54
                      THEN 'stage'
                      WHEN take_next.batch IS NULL OR take_next.batch < 1 OR take_next.batch > 10000 THEN 'batch'
                      WHEN v_lease <= interval '0' THEN 'lease_for'
                      WHEN pg_catalog.length(take_next.worker) > 200 THEN 'worker' END;
        PERFORM queue._raise_bad_argument('take_next', v_bad, pg_catalog.jsonb_build_object(
            'stage', take_next.stage, 'batch', take_next.batch::text, 'lease_for', v_lease::text,
            'worker', take_next.worker));
    END IF;
    -- </arguments>
    -- <settings> (the stage's row, else the defaults '*': the same text in _settings and its inline copies)
    v_settings := coalesce((SELECT s FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) take_next.stage),
                           (SELECT s FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) '*'));
    -- </settings>
    -- A restricted stage (grant_stage) hands tasks, and so their leases, only to the roles it
    -- lists; open stages skip the lookup. Denial raises rather than returning nothing.
    IF v_settings.restricted THEN
        PERFORM queue._check_access(take_next.stage, 'take');
    END IF;
    IF v_settings.paused THEN
        RETURN;  -- configure_stage(stage, paused => true): hand out nothing until resumed
    END IF;
    v_lease := coalesce(v_lease, v_settings.lease_duration);

    IF v_settings.max_running IS NOT NULL OR v_settings.group_limit IS NOT NULL OR v_settings.rate_limit IS NOT NULL THEN
        -- After the lock, each statement sees every take and finish its holders committed.
        PERFORM pg_catalog.pg_advisory_xact_lock(1936419947, pg_catalog.hashtext(take_next.stage));
        IF v_settings.rate_limit IS NOT NULL THEN
            -- Read after the lock, the clock orders the stage's takes: each counts in a window no
            -- earlier than the last one counted (started, in history, is this time).
            v_now := pg_catalog.clock_timestamp();
            IF NOT v_settings.rate_per_group THEN
                take_next.batch := least(take_next.batch, queue._rate_left(take_next.stage, '', v_now, v_settings));
                IF take_next.batch < 1 THEN
                    RETURN;  -- the window is used up: a poll in the next one takes again
                END IF;
            END IF;
        END IF;
        IF v_settings.max_running IS NOT NULL THEN
            SELECT pg_catalog.count(*)::integer INTO v_running
              FROM queue.live_tasks r
             WHERE r.stage = take_next.stage AND r.status = 'running';
            -- The claim below takes at most batch tasks: no more than the cap leaves room for.
            take_next.batch := least(take_next.batch, v_settings.max_running - v_running);
            IF take_next.batch < 1 THEN
                RETURN;
            END IF;
        END IF;
        -- The claim that counts what it takes in the rate window, group by group or for the stage.
        IF v_settings.group_limit IS NOT NULL OR v_settings.rate_limit IS NOT NULL THEN
            RETURN QUERY
            SELECT g.id, g.payload, g.attempt, g.lease, g.lease_expires, g.priority, g.key
              FROM queue._take_grouped(take_next.stage, take_next.batch, v_settings.group_limit,
                                       v_now, v_lease, take_next.worker) g;
            IF NOT FOUND THEN
                PERFORM queue._mark_waiting(take_next.stage);
            END IF;
            RETURN;
        END IF;
    END IF;

    -- Where to start in the claim index. Every take leaves the entry of the row it took behind
    -- (an UPDATE out of a partial index), and nothing removes those entries while any snapshot
    -- older than them is open: a scan from the stage's first entry walks all of them. So each
    -- session remembers where its last claim ended (setting skiplock.claim_hint) and starts
    -- there, unless a task of a lower priority number is due, nothing is due past that point,
    -- or the last scan from the beginning is 5 s old (for tasks that land behind it: a release,
    -- a long producer transaction's commit).
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
    IF v_setting = pg_catalog.concat_ws('/', v_from_priority, v_from_micros, v_from_id, v_rescan_at, take_next.stage)
       AND v_rescan_at::float8 > pg_catalog.date_part('epoch', v_now) * 1000000 THEN
        v_from_run_at   := timestamptz 'epoch' + v_from_micros * interval '1 microsecond';
        -- In claim order with LIMIT, not EXISTS: the generic plan of an EXISTS scans the table.
        IF (SELECT c.priority
              FROM queue.live_tasks c
             WHERE c.stage = take_next.stage
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
        -- SQL tasks (run_as set) are run_sql_tasks', in a session of their role: skipped here.
        -- The ids go in as an array, not joined from a CTE: with batch unknown, the generic plan
        -- of a join assumes thousands of picked rows and hashes a Seq Scan of the table; = ANY
        -- probes the primary key, so PL/pgSQL keeps one generic plan instead of planning every call.
        RETURN QUERY
        WITH claimed AS (
            UPDATE queue.live_tasks t
               SET status        = 'running',
                   attempt       = t.attempt + 1,
                   lease         = pg_catalog.md5(v_lease_seed || t.id::text)::uuid,
                   lease_expires = v_now + v_lease,
                   started       = v_now,
                   updated       = v_now,
                   worker        = take_next.worker
             WHERE t.stage = take_next.stage AND t.id = ANY (ARRAY(
                    SELECT c.id
                      FROM queue.live_tasks c
                     WHERE c.stage = take_next.stage
                       AND c.status IN ('ready', 'error')
                       AND c.run_as IS NULL
                       AND c.run_at <= v_now
                       AND (c.priority, c.run_at, c.id) >= (v_from_priority, v_from_run_at, v_from_id)
                     ORDER BY c.priority, c.run_at, c.id
                     LIMIT take_next.batch
                       FOR UPDATE SKIP LOCKED))
            RETURNING t.id, t.payload, t.attempt, t.lease, t.lease_expires, t.priority, t.key, t.run_at
        ), hint AS (
            -- The next claim of this session starts at the last task of this one.
            SELECT
              -- <claim hint> (queue._claim_hint's, the definition, inline: tests/py/test_one_way.py)
              pg_catalog.set_config('skiplock.claim_hint',
                  CASE WHEN pg_catalog.isfinite(c.run_at)
                       THEN pg_catalog.concat_ws('/', c.priority, (EXTRACT(epoch FROM c.run_at) * 1000000)::bigint,
                                                 c.id, v_rescan_at, take_next.stage)
                       ELSE '' END,
                  false)
              -- </claim hint>
              AS hint
              FROM (SELECT c.priority, c.run_at, c.id FROM claimed c
                     ORDER BY c.priority DESC, c.run_at DESC, c.id DESC LIMIT 1) c
        )
        SELECT c.id, c.payload, c.attempt, c.lease, c.lease_expires, c.priority, c.key
          FROM claimed c CROSS JOIN hint h
         ORDER BY c.priority, c.run_at, c.id;
        EXIT claim WHEN FOUND OR v_full;
        v_from_priority := NULL;  -- nothing due past the hint: look from the beginning
    END LOOP;
    -- Nothing due: the caller will wait on the stage's channel, so enqueues must NOTIFY.
    IF NOT FOUND THEN
        PERFORM queue._mark_waiting(take_next.stage);
    END IF;
END
$$;
COMMENT ON FUNCTION queue.take_next(text, integer, interval, text) IS 'Claims up to batch due tasks of a stage (priority, run_at, id; SKIP LOCKED, never waits), each with a new attempt and lease token. Starts where the session''s last claim ended. A stage with limits serialises its takers. 42501 for restricted stages.';
REVOKE ALL ON FUNCTION queue.take_next(text, integer, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.take_next(text, integer, interval, text) TO skiplock_worker, skiplock_admin;

-- take_next(stages, batch, lease_for, worker): take_next from several stages, fairly: up to `batch`
-- due tasks, each with the stage it came from. stages holds names and prefixes ending in '*'
-- ('tenant.*'); the stages are served in a round robin that goes on from this session's last turn,
-- each turn taking up to the stage's weight (stage_settings.weight) tasks, so that one stage's
-- backlog never starves another. A stage found by a prefix that the caller may not take from is
-- skipped; one named outright raises as take_next(stage) does. Each stage's take is take_next's
-- (order, leases, limits, pause, marks as waited on). Raises 22004/22023 for bad stages or batch,
-- 0A000 on Citus, and what take_next raises. Locks and writes what take_next does.
CREATE OR REPLACE FUNCTION queue.take_next(
        stages    text[],
        batch     integer  DEFAULT 1,
        lease_for interval DEFAULT NULL,
        worker    text     DEFAULT NULL)
    RETURNS TABLE (stage text, id bigint, payload jsonb, attempt integer, lease uuid, lease_expires timestamptz,
                   priority integer, key text)
    LANGUAGE sql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT t.stage, t.id, t.payload, t.attempt, t.lease, t.lease_expires, t.priority, t.key
      FROM queue._take_turns('next', take_next.stages, take_next.batch, take_next.lease_for, take_next.worker) t
$$;
COMMENT ON FUNCTION queue.take_next(text[], integer, interval, text) IS 'Claims up to batch due tasks from several stages (names, or prefixes such as ''tenant.*''), round robin by stage weight from the session''s last turn; each row names its stage. Prefix stages the caller may not take are skipped. 0A000 on Citus.';
REVOKE ALL ON FUNCTION queue.take_next(text[], integer, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.take_next(text[], integer, interval, text) TO skiplock_worker, skiplock_admin;
