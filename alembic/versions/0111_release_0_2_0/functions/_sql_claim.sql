-- _sql_claim(stage, worker): run_sql_tasks' first step: claim the next due SQL task of a stage
-- that the session's own login role enqueued. An executor runs only its own role's tasks: its
-- session is that role, so nothing a request does (RESET ROLE, a deferred trigger firing at
-- COMMIT, …) can reach privileges the role does not have. Honours the stage's pause,
-- max_running (with take_next's lock) and access grants; ordinary tasks and other roles' SQL
-- tasks in the stage are left alone. The worker name records the backend pid ('name#pid') for
-- cancel_overdue_sql_tasks; the lease covers the task's timeout (or the stage's lease_duration)
-- plus 30 s, so reap_hung leaves a slow statement to the watchdog. Finding nothing due, it marks
-- the stage as waited on (enqueue_sql then NOTIFYs, as for take_next).
-- Locks the claimed row; writes queue.live_tasks.
CREATE OR REPLACE FUNCTION queue._sql_claim(stage text, worker text DEFAULT NULL)
    RETURNS TABLE (id bigint, lease uuid, request text, timeout interval, attempt integer, started timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now      timestamptz := pg_catalog.now();
    -- By exact name: a cast of the name to regrole would parse it ("Reporting" as reporting,
    -- a role named 10 as OID 10).
    v_owner    regrole     := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = SESSION_USER)::regrole;
    v_worker   text        := pg_catalog.format('%s#%s', pg_catalog.left(coalesce(_sql_claim.worker, 'sql'), 180),
                                                pg_catalog.pg_backend_pid());
    v_settings queue.stage_settings;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN _sql_claim.stage IS NULL OR _sql_claim.stage IN ('', '*') OR pg_catalog.octet_length(_sql_claim.stage) > 54 THEN 'stage' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('_sql_claim', v_bad, pg_catalog.jsonb_build_object(
            'stage', _sql_claim.stage));
    END IF;
    -- </arguments>
    v_settings := queue._settings(_sql_claim.stage);
    IF v_settings.restricted THEN
        PERFORM queue._check_access(_sql_claim.stage, 'take');
    END IF;
    IF v_settings.paused THEN
        RETURN;
    END IF;
    IF v_settings.max_running IS NOT NULL THEN
        -- The lock take_next takes for a capped stage: SQL tasks and others share the cap.
        PERFORM pg_catalog.pg_advisory_xact_lock(1936419947, pg_catalog.hashtext(_sql_claim.stage));
        IF (SELECT pg_catalog.count(*) FROM queue.live_tasks r
             WHERE r.stage = _sql_claim.stage AND r.status = 'running') >= v_settings.max_running THEN
            RETURN;
        END IF;
    END IF;

    RETURN QUERY
    WITH picked AS (
        SELECT c.id
          FROM queue.live_tasks c
         WHERE c.stage = _sql_claim.stage
           AND c.status IN ('ready', 'error')
           AND c.run_at <= v_now
           AND c.run_as = v_owner
         ORDER BY c.priority, c.run_at, c.id
         LIMIT 1
           FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE queue.live_tasks t
           SET status        = 'running',
               attempt       = t.attempt + 1,
               lease         = pg_catalog.gen_random_uuid(),
               lease_expires = v_now + coalesce((t.payload ->> 'timeout')::interval, v_settings.lease_duration)
                                     + interval '30 seconds',
               started       = v_now,
               updated       = v_now,
               worker        = v_worker
          FROM picked
         WHERE t.id = picked.id
        RETURNING t.id, t.lease, t.payload, t.attempt
    )
    SELECT c.id, c.lease, c.payload ->> 'sql',
           coalesce((c.payload ->> 'timeout')::interval, v_settings.lease_duration), c.attempt, v_now
      FROM claimed c;
    IF NOT FOUND THEN
        PERFORM queue._mark_waiting(_sql_claim.stage);
    END IF;
END
$$;
COMMENT ON FUNCTION queue._sql_claim(text, text) IS 'Internal, for run_sql_tasks (role skiplock_sql): claims the next due SQL task of a stage enqueued by the session''s login role; returns its id, lease, request, timeout, attempt and start. Honours pause, max_running and stage access.';
REVOKE ALL ON FUNCTION queue._sql_claim(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._sql_claim(text, text) TO skiplock_sql;
