-- heartbeat(id, lease, lease_for, stage, progress): tell the queue this worker is alive and still on
-- the task. Renews the lease to now() + lease_for, or without lease_for to now() + the stage's
-- lease_duration unless the lease already runs longer, and returns the new expiry. progress, when
-- given (a JSON object or array bounded as payloads), replaces the task's progress (queue.tasks
-- shows it); NULL leaves it as it is.
-- Raises 22004 for a NULL id or lease, 22023 for a lease_for that is not positive or a JSON scalar
-- progress, 54000 for a progress over 1 MiB, and SK001 (lease lost) when the lease is not the
-- task's current one: the worker should stop working on the task, another attempt may already
-- run. Locks and writes the task's row of queue.live_tasks.
-- stage, when given, is the task's stage (routes the call on Citus); any other raises SK001.
CREATE OR REPLACE FUNCTION queue.heartbeat(id bigint, lease uuid, lease_for interval DEFAULT NULL,
                                           stage text DEFAULT NULL, progress jsonb DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_expires timestamptz;
    v_until   timestamptz;
    v_bad   text;    -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN heartbeat.id IS NULL OR heartbeat.lease IS NULL THEN 'id, lease'
                  WHEN heartbeat.lease_for <= interval '0' THEN 'lease_for'
                  WHEN pg_catalog.jsonb_typeof(heartbeat.progress) NOT IN ('object', 'array')
                       OR pg_catalog.pg_column_size(heartbeat.progress) > 1048576
                       OR pg_catalog.pg_column_compression(heartbeat.progress) IS NOT NULL
                  THEN 'progress' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('heartbeat', v_bad, pg_catalog.jsonb_build_object(
            'id', heartbeat.id::text, 'lease', heartbeat.lease::text, 'lease_for', heartbeat.lease_for::text,
            'progress', heartbeat.progress::text));
    END IF;
    -- </arguments>

    -- The worker's own figure is its estimate of the time it still needs; without one, the
    -- stage's lease_duration never shortens a longer lease the take asked for.
    IF heartbeat.stage IS NULL THEN
        UPDATE queue.live_tasks t
           SET lease_expires = CASE WHEN heartbeat.lease_for IS NOT NULL
                                    THEN pg_catalog.now() + heartbeat.lease_for
                                    ELSE greatest(t.lease_expires,
                                                  pg_catalog.now() + (queue._settings(t.stage)).lease_duration)
                               END,
               progress = coalesce(heartbeat.progress, t.progress)
         WHERE t.id = heartbeat.id AND t.lease = heartbeat.lease
        RETURNING t.lease_expires INTO v_expires;
    ELSE
        -- The stage is known: its duration first, so that the UPDATE calls nothing on a column and
        -- nothing but IMMUTABLE in its CASE (Citus refuses both on a distributed table).
        v_until := pg_catalog.now() + coalesce(heartbeat.lease_for, (queue._settings(heartbeat.stage)).lease_duration);
        UPDATE queue.live_tasks t
           SET lease_expires = CASE WHEN heartbeat.lease_for IS NOT NULL THEN v_until
                                    ELSE greatest(t.lease_expires, v_until) END,
               progress = coalesce(heartbeat.progress, t.progress)
         WHERE t.id = heartbeat.id AND t.lease = heartbeat.lease AND t.stage = heartbeat.stage
        RETURNING t.lease_expires INTO v_expires;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost'
            USING ERRCODE = 'SK001',
                  DETAIL = pg_catalog.format('Task %s is not running under this lease: it was reaped, released, retaken, finished, failed or cancelled.', heartbeat.id),
                  HINT = 'Stop working on this task; do not finish or fail it.';
    END IF;
    RETURN v_expires;
END
$$;
COMMENT ON FUNCTION queue.heartbeat(bigint, uuid, interval, text, jsonb) IS 'Renews the lease of a running attempt and returns the new expiry: now() + lease_for, else now() + the stage''s lease_duration unless longer already; stores progress if given. SK001 when the lease is not current.';
REVOKE ALL ON FUNCTION queue.heartbeat(bigint, uuid, interval, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.heartbeat(bigint, uuid, interval, text, jsonb) TO skiplock_worker, skiplock_admin;
