-- _end_awaited(task, status, attempt, worker, error_text, started, finished, result): end a
-- one-off task that something waits for (live_tasks.waits -1): record its end (_end_run: status
-- done or fatal, with the values given, result that of a done run), then resolve what waits for
-- it (_end_waits). finish and finish_locked leave such a task out of their one-statement move, so
-- that a task nothing waits for pays only that column's test, and end it here. The caller has
-- locked the row; the end is recorded only for a row this deleted.
-- Writes queue.live_tasks, queue.history or queue.finished_counts, and queue.dependencies; raises nothing of its own.
CREATE OR REPLACE FUNCTION queue._end_awaited(task queue.live_tasks, status queue.task_status, attempt integer,
                                              worker text, error_text text, started timestamptz,
                                              finished timestamptz, result jsonb DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM queue.live_tasks t WHERE t.id = task.id AND t.stage = task.stage;
    IF FOUND THEN  -- history only for a row this deleted (never two final rows for one run)
        PERFORM queue._end_run(task, _end_awaited.status, _end_awaited.attempt, _end_awaited.worker,
                               _end_awaited.error_text, _end_awaited.started, _end_awaited.finished,
                               _end_awaited.result);
        PERFORM queue._end_waits(task.id, _end_awaited.status);
    END IF;
END
$$;
COMMENT ON FUNCTION queue._end_awaited(queue.live_tasks, queue.task_status, integer, text, text, timestamptz, timestamptz, jsonb) IS 'Internal, for finish and finish_locked: moves a task something waits for to queue.history and resolves what waits for it (_end_waits).';
REVOKE ALL ON FUNCTION queue._end_awaited(queue.live_tasks, queue.task_status, integer, text, text, timestamptz, timestamptz, jsonb) FROM PUBLIC;
