-- _rearm(task, status, attempt, worker, error_text, started, finished, result): record a periodic
-- task's run (_end_run: in queue.history, or counted; status done or fatal, with the values given, result that of a done
-- run) and re-arm the same row, ready from attempt 0 and without progress, for its next slot after
-- `finished` (_next_slot). The caller has locked the row; history is written only when the row
-- was there to re-arm.
-- Writes queue.live_tasks and queue.history or queue.finished_counts; raises nothing of its own.
CREATE OR REPLACE FUNCTION queue._rearm(task queue.live_tasks, status queue.task_status, attempt integer,
                                        worker text, error_text text, started timestamptz, finished timestamptz,
                                        result jsonb DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Apart from the UPDATE: Citus calls no STABLE function on a column there.
    v_next timestamptz := queue._next_slot(task.slot, task.repeat, task.drift, _rearm.finished);
BEGIN
    UPDATE queue.live_tasks t
       SET status = 'ready', attempt = 0, run_at = v_next, slot = v_next,
           lease = NULL, lease_expires = NULL, started = NULL, worker = NULL,
           error_text = NULL, progress = NULL, updated = _rearm.finished
     WHERE t.id = task.id AND t.stage = task.stage;
    IF FOUND THEN  -- history only for a row this re-armed
        PERFORM queue._end_run(task, _rearm.status, _rearm.attempt, _rearm.worker, _rearm.error_text,
                               _rearm.started, _rearm.finished, _rearm.result);
    END IF;
END
$$;
COMMENT ON FUNCTION queue._rearm(queue.live_tasks, queue.task_status, integer, text, text, timestamptz, timestamptz, jsonb) IS 'Internal: records a periodic task''s run in queue.history and re-arms its row for the next slot.';
REVOKE ALL ON FUNCTION queue._rearm(queue.live_tasks, queue.task_status, integer, text, text, timestamptz, timestamptz, jsonb) FROM PUBLIC;
