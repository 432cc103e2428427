-- enqueue_sql(request, stage, run_at, timeout, priority, key, mode, repeat, drift, max,
-- keep_history): add an SQL task (pg_task style) and return its id. run_sql_tasks, in a session of
-- the caller's current role (SET ROLE, else the login), runs `request` at run_at (one statement
-- advised: several all run, and the result describes part of them) and stores its response in the
-- history row (result). timeout: the watchdog cancels it after that (NULL: the stage's
-- lease_duration). key, mode, repeat, drift: as enqueue; only the enqueuing role may re-run it.
-- max: sets the stage's max_running (an admin's; others may pass only the cap it has).
-- keep_history => false: a successful run leaves no history row. Members of skiplock_sql only.
-- Raises 22004/22023/54000 for bad arguments; 42501 for a restricted stage, a non-admin's new max,
-- or a key of another role's task. Writes queue.live_tasks (run_as, which nothing else sets) and,
-- for max, queue.stage_settings; NOTIFY as enqueue.
CREATE OR REPLACE FUNCTION queue.enqueue_sql(
        request      text,
        stage        text        DEFAULT 'sql',
        run_at       timestamptz DEFAULT NULL,
        timeout      interval    DEFAULT NULL,
        priority     integer     DEFAULT 0,
        key          text        DEFAULT NULL,
        mode         text        DEFAULT 'ignore',
        repeat       interval    DEFAULT NULL,
        drift        boolean     DEFAULT true,
        max          integer     DEFAULT NULL,
        keep_history boolean     DEFAULT true)
    RETURNS bigint
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- By exact name: a cast of the name to regrole would parse it ("Reporting" as reporting,
    -- a role named 10 as OID 10, a dotted name as an error).
    v_caller  regrole := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = queue._caller())::regrole;
    v_settings queue.stage_settings;
    v_payload jsonb;
    v_id      bigint;
    v_owner   regrole;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN enqueue_sql.request IS NULL OR pg_catalog.btrim(enqueue_sql.request, E' \t\r\n;') = ''
                       OR pg_catalog.octet_length(enqueue_sql.request) > 1048576 THEN 'request'
                  WHEN enqueue_sql.timeout <= interval '0' THEN 'timeout'
                  WHEN enqueue_sql.max < 1 THEN 'max'
                  WHEN enqueue_sql.keep_history IS NULL THEN 'keep_history'
                  WHEN enqueue_sql.stage IS NULL OR enqueue_sql.stage IN ('', '*') OR pg_catalog.octet_length(enqueue_sql.stage) > 54 THEN 'stage' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('enqueue_sql', v_bad, pg_catalog.jsonb_build_object(
            'request', enqueue_sql.request, 'timeout', enqueue_sql.timeout::text, 'max', enqueue_sql.max::text,
            'keep_history', enqueue_sql.keep_history::text, 'stage', enqueue_sql.stage));
    END IF;
    -- </arguments>
    v_payload := pg_catalog.jsonb_build_object('sql', enqueue_sql.request,
                                               'timeout', enqueue_sql.timeout::text,
                                               'keep_history', enqueue_sql.keep_history,
                                               'nonce', pg_catalog.gen_random_uuid());
    -- The payload wraps the request in a few dozen bytes: a request just under 1 MiB must get
    -- this error, not enqueue's "payload too large".
    IF pg_catalog.pg_column_size(v_payload) > 1048576 THEN  -- the request with its options, as stored
        PERFORM queue._raise_bad_argument('enqueue_sql', 'request, options', pg_catalog.jsonb_build_object(
            'request', enqueue_sql.request, 'stored', pg_catalog.pg_column_size(v_payload)::text));
    END IF;

    -- Access first: a caller with no right on a restricted stage learns nothing of its keys,
    -- and waits on none of its rows.
    v_settings := queue._settings(enqueue_sql.stage);
    IF v_settings.restricted THEN
        PERFORM queue._check_access(enqueue_sql.stage, 'enqueue');
    END IF;
    -- A stage's cap is its policy, which only admins set (configure_stage).
    IF enqueue_sql.max IS NOT NULL AND v_settings.max_running IS DISTINCT FROM enqueue_sql.max
       AND NOT pg_catalog.pg_has_role(queue._caller(), 'skiplock_admin', 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to set the cap of stage %', enqueue_sql.stage
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('max => %s would set the max_running of stage %s (now %s) for all its tasks; only skiplock_admin members change a stage''s policy.',
                                             enqueue_sql.max, pg_catalog.quote_literal(enqueue_sql.stage),
                                             coalesce(v_settings.max_running::text, 'no cap')),
                  HINT = pg_catalog.format('Leave max out, or ask an admin: SELECT queue.configure_stage(%s, max_running => %s);',
                                           pg_catalog.quote_literal(enqueue_sql.stage), enqueue_sql.max);
    END IF;

    IF enqueue_sql.key IS NOT NULL THEN
        -- A key of another role's task, or of an ordinary task, is not this caller's to touch.
        SELECT t.id, t.run_as INTO v_id, v_owner
          FROM queue.live_tasks t
         WHERE t.stage = enqueue_sql.stage AND t.key = enqueue_sql.key
           FOR UPDATE;
        IF v_id IS NOT NULL AND v_owner IS DISTINCT FROM v_caller THEN
            RAISE EXCEPTION 'key % of stage % belongs to another task', enqueue_sql.key, enqueue_sql.stage
                USING ERRCODE = '42501',
                      DETAIL = CASE WHEN v_owner IS NULL THEN pg_catalog.format('Task %s is an ordinary task.', v_id)
                                    ELSE pg_catalog.format('Task %s is an SQL task of role %s.', v_id, v_owner) END,
                      HINT = 'Use another key.';
        END IF;
        IF v_id IS NOT NULL AND enqueue_sql.mode = 'rerun' THEN
            -- enqueue() refuses to re-run an SQL task (its guard); this caller owns it, so lift
            -- the mark for the re-run inside this transaction and put it back.
            UPDATE queue.live_tasks t SET run_as = NULL WHERE t.id = v_id;
        END IF;
    END IF;

    v_id := queue.enqueue(v_payload, enqueue_sql.stage, enqueue_sql.priority, enqueue_sql.run_at,
                          enqueue_sql.key, enqueue_sql.mode, enqueue_sql.repeat, enqueue_sql.drift);
    -- The row is this caller's task: new or re-run by this call (its payload, with this call's
    -- nonce), or (mode 'ignore') already an SQL task of this role. A task a concurrent enqueue()
    -- inserted under the key between the check and here cannot have that payload, whatever it
    -- holds: it stays an ordinary task and the caller is told.
    -- An SQL task keeps its history whatever the stage's mode: the record of what ran as whom.
    UPDATE queue.live_tasks t
       SET run_as = v_caller, history = NULL
     WHERE t.id = v_id AND (t.run_as = v_caller OR (t.run_as IS NULL AND t.payload = v_payload));
    IF NOT FOUND THEN
        RAISE EXCEPTION 'key % of stage % belongs to another task', enqueue_sql.key, enqueue_sql.stage
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Task %s was enqueued under the key at the same time.', v_id),
                  HINT = 'Use another key.';
    END IF;

    -- An admin's max is written as before (the stage gets its own row); anyone else's equals the
    -- cap already (checked above) and changes nothing.
    IF enqueue_sql.max IS NOT NULL AND pg_catalog.pg_has_role(queue._caller(), 'skiplock_admin', 'MEMBER') THEN
        PERFORM queue.configure_stage(enqueue_sql.stage, max_running => enqueue_sql.max);
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION queue.enqueue_sql(text, text, timestamptz, interval, integer, text, text, interval, boolean, integer, boolean) IS 'Adds an SQL task and returns its id: run_sql_tasks runs request as the calling role at run_at, cancels it after timeout and keeps its rows in the history row (result). key/mode/repeat/drift as enqueue; max sets max_running. skiplock_sql members only.';
REVOKE ALL ON FUNCTION queue.enqueue_sql(text, text, timestamptz, interval, integer, text, text, interval, boolean, integer, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.enqueue_sql(text, text, timestamptz, interval, integer, text, text, interval, boolean, integer, boolean) TO skiplock_sql, skiplock_admin;
