-- Bounds, W1 and W2: the least a function API costs. skiplock's INSERT of a task, its claim and its
-- move to history, each alone in a PL/pgSQL function that is SECURITY DEFINER with a pinned
-- search_path, as skiplock's are, and nothing else (no argument checks, settings, wake-up, claim
-- position or fence). Created by bench.peers in its own schema of the bench database;
-- bounds/enqueue_wrapped.sql, enqueue_checked.sql and process_wrapped.sql call them.
CREATE SCHEMA IF NOT EXISTS bounds;
CREATE OR REPLACE FUNCTION bounds.take(stage text)
    RETURNS TABLE (id bigint)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT t.id FROM queue.live_tasks t
     WHERE t.stage = take.stage AND t.status IN ('ready', 'error') AND t.run_as IS NULL
       AND t.run_at <= pg_catalog.now()
     ORDER BY t.priority, t.run_at, t.id
     LIMIT 1 FOR UPDATE SKIP LOCKED;
END
$$;
CREATE OR REPLACE FUNCTION bounds.finish(id bigint, stage text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    WITH d AS (DELETE FROM queue.live_tasks t WHERE t.id = finish.id AND t.stage = finish.stage RETURNING t.*)
    INSERT INTO queue.history
    SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt + 1, NULL, NULL,
                               pg_catalog.now(), pg_catalog.clock_timestamp())).*
      FROM d;
    RETURN FOUND;
END
$$;
CREATE OR REPLACE FUNCTION bounds.enqueue(payload jsonb, stage text)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO queue.live_tasks AS t (stage, payload) VALUES (enqueue.stage, enqueue.payload)
    RETURNING t.id INTO v_id;
    RETURN v_id;
END
$$;
-- The same with the tests of its two arguments that queue.enqueue runs first (a stage that can
-- name a channel, a JSON object or array of at most 1 MB), raising a clear error: the least a
-- function that refuses bad input costs.
CREATE OR REPLACE FUNCTION bounds.enqueue_checked(payload jsonb, stage text)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF enqueue_checked.stage IS NULL OR enqueue_checked.stage IN ('', '*')
       OR pg_catalog.octet_length(enqueue_checked.stage) > 54
       OR enqueue_checked.payload IS NULL
       OR pg_catalog.jsonb_typeof(enqueue_checked.payload) NOT IN ('object', 'array')
       OR pg_catalog.pg_column_size(enqueue_checked.payload) > 1048576 THEN
        RAISE EXCEPTION 'invalid stage or payload' USING ERRCODE = '22023';
    END IF;
    INSERT INTO queue.live_tasks AS t (stage, payload) VALUES (enqueue_checked.stage, enqueue_checked.payload)
    RETURNING t.id INTO v_id;
    RETURN v_id;
END
$$;
