-- enqueue(payload, stage, priority, run_at, key, mode): add a task; returns its id.
--   key   optional; unique among the live tasks of the stage.
--   mode  what to do when the key names a live task already:
--         'ignore' (default)  change nothing, return the existing id;
--         'rerun'             the seed's re-run of a changed task: a waiting task takes the new
--                             payload, priority and run_at and starts over at attempt 0; a running
--                             one keeps running and is queued again (with the new payload) when
--                             its current attempt finishes or fails.
-- Writes queue.live_tasks; sends NOTIFY on channel 'skiplock.<stage>' unless the stage turned it off.
CREATE OR REPLACE FUNCTION queue.enqueue(
        payload  jsonb,
        stage    text        DEFAULT 'default',
        priority integer     DEFAULT 0,
        run_at   timestamptz DEFAULT NULL,
        key      text        DEFAULT NULL,
        mode     text        DEFAULT 'ignore')
    RETURNS bigint
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id  bigint;
    v_now timestamptz := pg_catalog.now();
BEGIN
    PERFORM queue._check_stage(enqueue.stage);
    PERFORM queue._check_payload(enqueue.payload);
    IF enqueue.priority IS NULL THEN
        RAISE EXCEPTION 'priority must not be NULL'
            USING ERRCODE = '22004', HINT = 'Lower runs first; the default is 0.';
    END IF;
    IF enqueue.mode IS NULL OR enqueue.mode NOT IN ('ignore', 'rerun') THEN
        RAISE EXCEPTION 'unknown enqueue mode'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('mode is %s.', coalesce(pg_catalog.quote_literal(enqueue.mode), 'NULL')),
                  HINT = 'Use ''ignore'' (keep the existing task) or ''rerun'' (run it again with the new payload).';
    END IF;
    IF enqueue.key = '' OR pg_catalog.length(enqueue.key) > 1000 THEN
        RAISE EXCEPTION 'invalid key'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The key has %s characters.', pg_catalog.length(enqueue.key)),
                  HINT = 'A key is 1 to 1000 characters, or NULL for none.';
    END IF;

    IF enqueue.key IS NULL THEN
        INSERT INTO queue.live_tasks AS t (stage, priority, run_at, payload, created, updated)
        VALUES (enqueue.stage, enqueue.priority, coalesce(enqueue.run_at, v_now),
                enqueue.payload, v_now, v_now)
        RETURNING t.id INTO v_id;
    ELSIF enqueue.mode = 'ignore' THEN
        -- The existing task may finish between the insert and the select: then try again.
        LOOP
            INSERT INTO queue.live_tasks AS t (stage, priority, run_at, payload, key, created, updated)
            VALUES (enqueue.stage, enqueue.priority, coalesce(enqueue.run_at, v_now),
                    enqueue.payload, enqueue.key, v_now, v_now)
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
        INSERT INTO queue.live_tasks AS t (stage, priority, run_at, payload, key, created, updated)
        VALUES (enqueue.stage, enqueue.priority, coalesce(enqueue.run_at, v_now),
                enqueue.payload, enqueue.key, v_now, v_now)
        ON CONFLICT (stage, key) WHERE key IS NOT NULL DO UPDATE
           SET payload    = excluded.payload,
               priority   = excluded.priority,
               run_at     = excluded.run_at,
               updated    = excluded.updated,
               -- a running task finishes its attempt first; a waiting one starts over now
               rerun      = (t.status = 'running'),
               attempt    = CASE WHEN t.status = 'running' THEN t.attempt ELSE 0 END,
               status     = CASE WHEN t.status = 'running' THEN t.status ELSE 'ready' END,
               error_text = CASE WHEN t.status = 'running' THEN t.error_text END
        RETURNING t.id INTO v_id;
    END IF;

    IF (queue._settings(enqueue.stage)).notify THEN
        PERFORM pg_catalog.pg_notify('skiplock.' || enqueue.stage, '');
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION queue.enqueue(jsonb, text, integer, timestamptz, text, text) IS 'Adds a task to a stage and returns its id. With a key, an existing live task of that key is kept (mode ''ignore'') or re-run with the new payload (mode ''rerun''). Inserts one row into queue.live_tasks; wakes listeners on channel skiplock.<stage>.';
REVOKE ALL ON FUNCTION queue.enqueue(jsonb, text, integer, timestamptz, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.enqueue(jsonb, text, integer, timestamptz, text, text) TO skiplock_producer, skiplock_admin;
