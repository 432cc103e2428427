-- enqueue_batch(payloads, stage, priority, run_at, group_key): add many tasks in one call (bulk
-- loads, producers that buffer) and return the new ids in the order of payloads. All or nothing:
-- one bad payload rejects the batch. No keys or repeats (use enqueue() for those); every task gets
-- the same group_key (optional).
-- Raises 22004/22023/54000 for bad arguments (naming the element), 42501 for a restricted stage
-- (grant_stage) the caller may not enqueue into. Writes queue.live_tasks; one NOTIFY
-- skiplock.<stage> while a worker waits (stage_waiters).
CREATE OR REPLACE FUNCTION queue.enqueue_batch(
        payloads  jsonb[],
        stage     text        DEFAULT 'default',
        priority  integer     DEFAULT 0,
        run_at    timestamptz DEFAULT NULL,
        group_key text        DEFAULT NULL)
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now      timestamptz := pg_catalog.now();
    v_bad      record;
    v_detail   text;
    v_hint     text;
    v_restricted boolean;
    v_history  text;
BEGIN
    PERFORM queue._check_stage(enqueue_batch.stage);
    IF enqueue_batch.priority IS NULL THEN
        RAISE EXCEPTION 'priority must not be NULL'
            USING ERRCODE = '22004', DETAIL = 'enqueue_batch was called with priority NULL.',
                  HINT = 'Lower runs first; the default is 0.';
    END IF;
    IF enqueue_batch.payloads IS NULL OR pg_catalog.cardinality(enqueue_batch.payloads) > 100000 THEN
        RAISE EXCEPTION 'payloads must be an array of at most 100000 payloads'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('payloads has %s elements.', coalesce(pg_catalog.cardinality(enqueue_batch.payloads)::text, 'NULL')),
                  HINT = 'Split larger loads into several calls.';
    END IF;
    IF enqueue_batch.group_key = '' OR pg_catalog.length(enqueue_batch.group_key) > 200 THEN
        RAISE EXCEPTION 'invalid group_key'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The group_key has %s characters.', pg_catalog.length(enqueue_batch.group_key)),
                  HINT = 'A group_key is 1 to 200 characters, or NULL for none.';
    END IF;
    SELECT p.ord, p.payload INTO v_bad
      FROM pg_catalog.unnest(enqueue_batch.payloads) WITH ORDINALITY AS p(payload, ord)
     WHERE p.payload IS NULL OR pg_catalog.jsonb_typeof(p.payload) NOT IN ('object', 'array')
        OR pg_catalog.pg_column_size(p.payload) > 1048576
        OR (pg_catalog.pg_column_compression(p.payload) IS NOT NULL  -- compressed: measured uncompressed
            AND pg_catalog.pg_column_size(p.payload || CASE pg_catalog.jsonb_typeof(p.payload)
                                                         WHEN 'object' THEN '{}'::jsonb ELSE '[]'::jsonb END) > 1048576)
     LIMIT 1;
    IF FOUND THEN
        BEGIN
            PERFORM queue._check_payload(v_bad.payload);
        EXCEPTION WHEN null_value_not_allowed OR invalid_parameter_value OR program_limit_exceeded THEN
            -- Re-raise the payload's own error, saying which element it was (its position:
            -- the first is 1, whatever the array's lower bound).
            GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
            RAISE EXCEPTION 'payloads[%]: %', v_bad.ord, SQLERRM
                USING ERRCODE = SQLSTATE, DETAIL = pg_catalog.concat_ws(' ', pg_catalog.format('Element %s of the array.', v_bad.ord), NULLIF(v_detail, '')),
                      HINT = coalesce(NULLIF(v_hint, ''), 'Every payload must be a JSON object or array of at most 1 MiB.');
        END;
    END IF;
    -- <producer access> (one probe of the stage's own row: '*' is never restricted and keeps all
    -- history; the same text in enqueue and enqueue_batch). The task carries the stage's history mode.
    SELECT s.restricted, s.history INTO v_restricted, v_history
      FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) enqueue_batch.stage;
    IF v_restricted THEN
        PERFORM queue._check_access(enqueue_batch.stage, 'enqueue');
    END IF;
    -- </producer access>

    RETURN QUERY
    INSERT INTO queue.live_tasks AS t (stage, priority, run_at, payload, created, updated, group_key, history)
    SELECT enqueue_batch.stage, enqueue_batch.priority, coalesce(enqueue_batch.run_at, v_now),
           p.payload, v_now, v_now, enqueue_batch.group_key, v_history
      FROM pg_catalog.unnest(enqueue_batch.payloads) WITH ORDINALITY AS p(payload, ord)
     ORDER BY p.ord
    RETURNING t.id;

    -- Only while a worker waits (take_next found the stage empty): NOTIFY serialises commits.
    -- _wake_waiters reads the stage's notify setting, so a busy stage never looks it up.
    IF EXISTS (SELECT 1 FROM queue.stage_waiters w WHERE w.stage = enqueue_batch.stage AND w.until > v_now) THEN
        PERFORM queue._wake_waiters(enqueue_batch.stage);  -- one NOTIFY per wait: it ends the mark
    END IF;
END
$$;
COMMENT ON FUNCTION queue.enqueue_batch(jsonb[], text, integer, timestamptz, text) IS 'Adds many tasks to a stage in one statement, all or nothing; returns their ids in order. No keys or repeats (use enqueue); one optional group_key for all. Raises 22004/22023/54000 for bad arguments, 42501 for a restricted stage.';
REVOKE ALL ON FUNCTION queue.enqueue_batch(jsonb[], text, integer, timestamptz, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.enqueue_batch(jsonb[], text, integer, timestamptz, text) TO skiplock_producer, skiplock_admin;
