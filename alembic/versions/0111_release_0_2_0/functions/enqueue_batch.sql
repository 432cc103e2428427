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
    v_bad      text;  -- the first bad argument's name
    v_restricted boolean;
    v_history  text;
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN enqueue_batch.stage IS NULL OR enqueue_batch.stage IN ('', '*') OR pg_catalog.octet_length(enqueue_batch.stage) > 54
                  THEN 'stage'
                  WHEN enqueue_batch.priority IS NULL THEN 'priority'
                  WHEN enqueue_batch.payloads IS NULL OR pg_catalog.cardinality(enqueue_batch.payloads) > 100000 THEN 'payloads'
                  WHEN enqueue_batch.group_key = '' OR pg_catalog.length(enqueue_batch.group_key) > 200 THEN 'group_key'
                  WHEN EXISTS (SELECT FROM pg_catalog.unnest(enqueue_batch.payloads) AS p(payload)
                                WHERE p.payload IS NULL OR pg_catalog.jsonb_typeof(p.payload) NOT IN ('object', 'array')
                                   OR pg_catalog.pg_column_size(p.payload) > 1048576
                                   OR (pg_catalog.pg_column_compression(p.payload) IS NOT NULL  -- compressed: measured uncompressed
                                       AND pg_catalog.pg_column_size(p.payload || CASE pg_catalog.jsonb_typeof(p.payload)
                                                                                    WHEN 'object' THEN '{}'::jsonb ELSE '[]'::jsonb END) > 1048576))
                  THEN 'payloads[i]' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('enqueue_batch', v_bad, pg_catalog.jsonb_build_object(
            'stage', enqueue_batch.stage, 'priority', enqueue_batch.priority::text, 'payloads', enqueue_batch.payloads::text,
            'group_key', enqueue_batch.group_key));
    END IF;
    -- </arguments>
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
