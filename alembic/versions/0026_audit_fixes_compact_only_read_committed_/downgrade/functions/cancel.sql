-- cancel(id): an admin gives up on a live task (ready, error or running): it moves to
-- queue.history as 'cancelled'. A worker still running it finds its lease gone (finish and fail
-- return false, heartbeat raises SK001). For a periodic task this ends its schedule: its history
-- keeps the runs. Raises 22004 for a NULL id, P0002 for an unknown id, 55000 for a finished task.
CREATE OR REPLACE FUNCTION queue.cancel(id bigint)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := pg_catalog.now();
BEGIN
    IF cancel.id IS NULL THEN
        RAISE EXCEPTION 'id must not be NULL'
            USING ERRCODE = '22004', HINT = 'Pass the id of a task, e.g. from queue.tasks.';
    END IF;
    WITH gone AS (
        DELETE FROM queue.live_tasks t WHERE t.id = cancel.id RETURNING t.*
    )
    INSERT INTO queue.history (id, stage, status, priority, run_at, payload, key, attempt, worker,
                               error_text, created, started, finished, group_key, run_as)
    SELECT g.id, g.stage, 'cancelled', g.priority, g.run_at, g.payload, g.key, g.attempt, g.worker,
           g.error_text, g.created, g.started, v_now, g.group_key, g.run_as
      FROM gone g;
    IF NOT FOUND THEN
        PERFORM queue._raise_not_live(cancel.id, 'cancel');
    END IF;
END
$$;
COMMENT ON FUNCTION queue.cancel(bigint) IS 'Cancels a live task (ready, error or running): moves it to queue.history as cancelled (a periodic task: its schedule ends); a worker running it loses its lease. Raises 22004 for a NULL id, P0002 for an unknown id, 55000 for a finished one.';
REVOKE ALL ON FUNCTION queue.cancel(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.cancel(bigint) TO skiplock_admin;
