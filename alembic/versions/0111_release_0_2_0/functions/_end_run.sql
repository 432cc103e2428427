-- _end_run(task, status, attempt, worker, error_text, started, finished, result): record the end
-- of one task's run: its queue.history row (_history_row, with the values given) when the task's
-- history mode keeps it (live_tasks.history NULL: all; 'failures': a fatal end), else one run
-- counted in queue.finished_counts (_count_runs). The one rule for a single task; the statements
-- that end many tasks at once (finish's and finish_locked's move, consume, drain, finish_batch,
-- reap_hung) test task.history in their own WHERE. The caller has deleted or re-armed the row.
-- Writes queue.history or queue.finished_counts; raises nothing of its own.
CREATE OR REPLACE FUNCTION queue._end_run(task queue.live_tasks, status queue.task_status, attempt integer,
                                          worker text, error_text text, started timestamptz,
                                          finished timestamptz, result jsonb DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF task.history IS NULL OR (task.history = 'failures' AND _end_run.status = 'fatal') THEN
        INSERT INTO queue.history
        SELECT (queue._history_row(task, _end_run.status, _end_run.attempt, _end_run.worker, _end_run.error_text,
                                   _end_run.started, _end_run.finished, _end_run.result)).*;
    ELSE
        PERFORM queue._count_runs(task.stage, _end_run.status);
    END IF;
END
$$;
COMMENT ON FUNCTION queue._end_run(queue.live_tasks, queue.task_status, integer, text, text, timestamptz, timestamptz, jsonb) IS 'Internal: records the end of one task''s run: a queue.history row when the task''s history mode keeps it, else a count in queue.finished_counts.';
REVOKE ALL ON FUNCTION queue._end_run(queue.live_tasks, queue.task_status, integer, text, text, timestamptz, timestamptz, jsonb) FROM PUBLIC;
