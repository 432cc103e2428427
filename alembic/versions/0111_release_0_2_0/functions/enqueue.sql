-- enqueue(payload, stage, priority, run_at, key, mode, repeat, drift, group_key, after, after_failed):
-- add a task, return its id. key is optional, unique among the live tasks of the stage; when it
-- names one, mode 'ignore' (default) returns that id unchanged, and mode 'rerun' gives a task not
-- running the new payload, priority, run_at, repeat and drift from attempt 0 (one that waits for
-- others goes on waiting), or queues a running one again with them when its attempt ends. repeat
-- (at least 1 second, no negative part) makes the task periodic: each finish records the run and
-- re-arms it; drift (default true) plans the next run from this run's slot, false from its end.
-- group_key (1 to 200 characters) counts it against the stage's group_limit. after (ids) makes it
-- wait until those tasks have ended; after_failed: 'cancel' (default) or 'run' (_enqueue_after).
-- Raises 22004/22023/54000 for bad arguments, 42501 for a restricted stage (grant_stage) the caller
-- may not enqueue into, or for mode 'rerun' on an SQL task's key. Writes queue.live_tasks; NOTIFY
-- skiplock.<stage> while a worker waits (stage_waiters), unless the stage turned it off.
CREATE OR REPLACE FUNCTION queue.enqueue(
        payload   jsonb,
        stage     text        DEFAULT 'default',
        priority  integer     DEFAULT 0,
        run_at    timestamptz DEFAULT NULL,
        key       text        DEFAULT NULL,
        mode      text        DEFAULT 'ignore',
        repeat    interval    DEFAULT NULL,
        drift     boolean     DEFAULT true,
        group_key text        DEFAULT NULL,
        after     bigint[]    DEFAULT NULL,
        after_failed text     DEFAULT 'cancel')
    RETURNS bigint
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id       bigint;
    v_held       text;
    v_now    timestamptz := pg_catalog.now();
    v_run_at timestamptz := coalesce(enqueue.run_at, v_now);
    -- A periodic task's first slot is its first run.
    v_slot   timestamptz := CASE WHEN enqueue.repeat IS NOT NULL THEN v_run_at END;
    v_restricted boolean;
    v_history    text;
    v_bad    text;    -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    -- The hot path evaluates only the guard, the CASE's tests joined by OR (a text CASE costs
    -- 8 k more a call: docs/decisions.md); tests/py/test_one_way.py keeps the two the same. An
    -- optional argument's tests (and the measure of a compressed payload), whose functions
    -- PL/pgSQL sets up again in every transaction, run only when one is given.
    IF enqueue.stage IS NULL OR enqueue.stage IN ('', '*') OR pg_catalog.octet_length(enqueue.stage) > 54
       OR enqueue.payload IS NULL OR pg_catalog.jsonb_typeof(enqueue.payload) NOT IN ('object', 'array')
       OR pg_catalog.pg_column_size(enqueue.payload) > 1048576 OR enqueue.priority IS NULL
       OR enqueue.mode IS NULL OR enqueue.mode NOT IN ('ignore', 'rerun') OR enqueue.drift IS NULL
       OR enqueue.key IS NOT NULL OR enqueue.repeat IS NOT NULL OR enqueue.group_key IS NOT NULL
       OR pg_catalog.pg_column_compression(enqueue.payload) IS NOT NULL THEN
        v_bad := CASE WHEN enqueue.stage IS NULL OR enqueue.stage IN ('', '*') OR pg_catalog.octet_length(enqueue.stage) > 54
                      THEN 'stage'
                      WHEN enqueue.payload IS NULL OR pg_catalog.jsonb_typeof(enqueue.payload) NOT IN ('object', 'array')
                           OR pg_catalog.pg_column_size(enqueue.payload) > 1048576 THEN 'payload'
                      WHEN enqueue.priority IS NULL THEN 'priority'
                      WHEN enqueue.mode IS NULL OR enqueue.mode NOT IN ('ignore', 'rerun') THEN 'mode'
                      WHEN enqueue.drift IS NULL THEN 'drift'
                      WHEN enqueue.key IS NOT NULL OR enqueue.repeat IS NOT NULL OR enqueue.group_key IS NOT NULL
                           OR pg_catalog.pg_column_compression(enqueue.payload) IS NOT NULL THEN 'optional' END;
        IF v_bad = 'optional' THEN
            v_bad := CASE WHEN enqueue.key = '' OR pg_catalog.length(enqueue.key) > 1000 THEN 'key'
                          WHEN enqueue.repeat < interval '1 second'
                               OR pg_catalog.date_part('year', enqueue.repeat) < 0 OR pg_catalog.date_part('month', enqueue.repeat) < 0
                               OR pg_catalog.date_part('day', enqueue.repeat) < 0
                               OR enqueue.repeat - pg_catalog.date_trunc('day', enqueue.repeat) < interval '0' THEN 'repeat'
                          WHEN enqueue.group_key = '' OR pg_catalog.length(enqueue.group_key) > 200 THEN 'group_key'
                          -- last: measured uncompressed there, it may turn out to fit
                          WHEN pg_catalog.pg_column_compression(enqueue.payload) IS NOT NULL THEN 'payload' END;
        END IF;
        IF v_bad IS NOT NULL THEN
            PERFORM queue._raise_bad_argument('enqueue', v_bad, pg_catalog.jsonb_build_object(
                'stage', enqueue.stage, 'payload', enqueue.payload::text, 'priority', enqueue.priority::text,
                'mode', enqueue.mode, 'drift', enqueue.drift::text, 'key', enqueue.key,
                'repeat', enqueue.repeat::text, 'group_key', enqueue.group_key));
        END IF;
    END IF;
    -- </arguments>
    -- <producer access> (one probe of the stage's own row: '*' is never restricted and keeps all
    -- history; the same text in enqueue and enqueue_batch). The task carries the stage's history mode.
    SELECT s.restricted, s.history INTO v_restricted, v_history
      FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) enqueue.stage;
    IF v_restricted THEN
        PERFORM queue._check_access(enqueue.stage, 'enqueue');
    END IF;
    -- </producer access>
    IF enqueue.after IS NOT NULL THEN
        RETURN queue._enqueue_after(enqueue.payload, enqueue.stage, enqueue.priority, v_run_at, enqueue.key,
                                    enqueue.mode, enqueue.repeat, enqueue.group_key, enqueue.after,
                                    enqueue.after_failed);
    END IF;

    IF enqueue.key IS NULL THEN
        INSERT INTO queue.live_tasks AS t (stage, priority, run_at, payload, created, updated,
                                           repeat, drift, slot, group_key, history)
        VALUES (enqueue.stage, enqueue.priority, v_run_at, enqueue.payload, v_now, v_now,
                enqueue.repeat, enqueue.drift, v_slot, enqueue.group_key, v_history)
        RETURNING t.id INTO v_id;
    ELSIF enqueue.mode = 'ignore' THEN
        -- The existing task may finish between the insert and the select: then try again.
        LOOP
            INSERT INTO queue.live_tasks AS t (stage, priority, run_at, payload, key, created, updated,
                                               repeat, drift, slot, group_key, history)
            VALUES (enqueue.stage, enqueue.priority, v_run_at, enqueue.payload, enqueue.key, v_now, v_now,
                    enqueue.repeat, enqueue.drift, v_slot, enqueue.group_key, v_history)
            ON CONFLICT (stage, key) WHERE key IS NOT NULL DO NOTHING
            RETURNING t.id INTO v_id;
            EXIT WHEN v_id IS NOT NULL;
            SELECT t.id INTO v_id
              FROM queue.live_tasks t
             WHERE t.stage = enqueue.stage AND t.key = enqueue.key;
            IF v_id IS NOT NULL THEN
                RETURN v_id;  -- nothing new to wake workers for
            END IF;
        END LOOP;
    ELSE
        INSERT INTO queue.live_tasks AS t (stage, priority, run_at, payload, key, created, updated,
                                           repeat, drift, slot, group_key, history)
        VALUES (enqueue.stage, enqueue.priority, v_run_at, enqueue.payload, enqueue.key, v_now, v_now,
                enqueue.repeat, enqueue.drift, v_slot, enqueue.group_key, v_history)
        ON CONFLICT (stage, key) WHERE key IS NOT NULL DO UPDATE
           SET payload    = excluded.payload,
               priority   = excluded.priority,
               run_at     = excluded.run_at,
               updated    = v_now,
               repeat     = excluded.repeat,
               drift      = excluded.drift,
               slot       = excluded.slot,
               history    = excluded.history,  -- the stage's mode now
               -- a running task finishes its attempt first; a ready or failed one starts over now;
               -- one that waits for others (after) goes on waiting
               rerun      = (t.status = 'running'),
               attempt    = CASE WHEN t.status = 'running' THEN t.attempt ELSE 0 END,
               status     = CASE WHEN t.status IN ('running', 'waiting') THEN t.status ELSE 'ready' END,
               error_text = CASE WHEN t.status = 'running' THEN t.error_text END
         -- an SQL task's request is its payload: only enqueue_sql, as its role, may replace it
         WHERE t.run_as IS NULL
        RETURNING t.id INTO v_id;
        IF v_id IS NULL THEN
            RAISE EXCEPTION 'key % of stage % belongs to an SQL task', enqueue.key, enqueue.stage
                USING ERRCODE = '42501',
                      DETAIL = 'mode ''rerun'' would replace the request of a task that runs as the role that enqueued it.',
                      HINT = 'Re-run it with queue.enqueue_sql(…, key => …, mode => ''rerun'') as that role, or use another key.';
        END IF;
        -- Re-run by the transaction that holds it (take_locked): no longer its to finish.
        v_held := pg_catalog.current_setting('skiplock.held', true);
        -- (Its entry binds the attempt and run_at it replaced: struck out by its id.)
        IF pg_catalog.strpos(v_held, v_id || ':') > 0 THEN
            PERFORM pg_catalog.set_config('skiplock.held',
                        pg_catalog.regexp_replace(v_held, '(^|,)' || v_id || ':[0-9a-f]{32},', '\1'), true);
        END IF;
    END IF;

    -- Only while a worker waits (take_next found the stage empty): NOTIFY serialises commits.
    -- _wake_waiters reads the stage's notify setting, so a busy stage never looks it up.
    IF EXISTS (SELECT 1 FROM queue.stage_waiters w WHERE w.stage = enqueue.stage AND w.until > v_now) THEN
        PERFORM queue._wake_waiters(enqueue.stage);  -- one NOTIFY per wait: it ends the mark
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION queue.enqueue(jsonb, text, integer, timestamptz, text, text, interval, boolean, text, bigint[], text) IS 'Adds a task to a stage, returns its id. A live task of the same key is kept (mode ''ignore'') or re-run with the new values (''rerun''). repeat/drift: periodic; group_key: group_limit; after => ids: waits until they end. 42501: restricted stage.';
REVOKE ALL ON FUNCTION queue.enqueue(jsonb, text, integer, timestamptz, text, text, interval, boolean, text, bigint[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.enqueue(jsonb, text, integer, timestamptz, text, text, interval, boolean, text, bigint[], text) TO skiplock_producer, skiplock_admin;
