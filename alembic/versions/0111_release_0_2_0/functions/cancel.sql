-- cancel(id, stage): an admin gives up on a live task (ready, error, waiting or running): it moves
-- to queue.history as 'cancelled'; what waited for it is resolved (_end_waits). A worker still
-- running it finds its lease gone (finish and fail return false, heartbeat raises SK001). For a periodic task this ends its schedule; its history keeps the runs.
-- A task cancelled while it waits is recorded without a start, so its wait is not counted as run
-- time. Raises 22004 for a NULL id, P0002 for an unknown id, 55000 for a finished task.
-- Locks the task's row; writes queue.live_tasks, its end (_end_run: queue.history, or a count for a
-- stage that keeps none), queue.dependencies via _end_waits.
-- stage, when given, is the task's stage (routes the call on Citus); any other: P0002.
CREATE OR REPLACE FUNCTION queue.cancel(id bigint, stage text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now  timestamptz := pg_catalog.now();
    v_task queue.live_tasks;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN cancel.id IS NULL THEN 'id' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('cancel', v_bad, pg_catalog.jsonb_build_object('id', cancel.id::text));
    END IF;
    -- </arguments>
    DELETE FROM queue.live_tasks t
     WHERE t.id = cancel.id AND (cancel.stage IS NULL OR t.stage = cancel.stage)
    RETURNING t.* INTO v_task;
    IF NOT FOUND THEN
        PERFORM queue._raise_not_live(cancel.id, 'cancel', cancel.stage);
    END IF;
    -- A statement of its own: its snapshot sees a run that ended while the DELETE waited for the
    -- row (finish_locked stamps the clock, later than this now()), and the cancel, the task's
    -- last event, is stamped no earlier than it.
    -- A task cancelled while it waits has no run to time (queue.hourly: finished - started).
    PERFORM queue._end_run(v_task, 'cancelled', v_task.attempt, v_task.worker, v_task.error_text,
                           CASE WHEN v_task.status = 'running' THEN v_task.started END,
                           GREATEST(v_now, (SELECT pg_catalog.max(h.finished) FROM queue.history h
                                             WHERE h.id = v_task.id AND h.stage = v_task.stage)));
    IF v_task.waits <> 0 THEN  -- it waits, or something waits for it
        PERFORM queue._end_waits(v_task.id, 'cancelled');
    END IF;
END
$$;
COMMENT ON FUNCTION queue.cancel(bigint, text) IS 'Cancels a live task (ready, error or running): moves it to queue.history as cancelled (a periodic task: its schedule ends); a worker running it loses its lease. Raises 22004 for a NULL id, P0002 for an unknown id, 55000 for a finished one.';
REVOKE ALL ON FUNCTION queue.cancel(bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.cancel(bigint, text) TO skiplock_admin;
