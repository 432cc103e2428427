-- _history_row(task, status, attempt, worker, error_text, started, finished, result): the queue.history
-- row of a task that ends, the one place that maps live_tasks to history. Every move to history is
-- INSERT INTO queue.history SELECT (queue._history_row(…)).*. result is what a done run returned
-- (finish(…, result)), NULL otherwise. No SET clause and IMMUTABLE, so that the planner inlines it
-- into the caller's statement, which runs with a pinned search_path.
CREATE OR REPLACE FUNCTION queue._history_row(task queue.live_tasks, status queue.task_status, attempt integer,
                                              worker text, error_text text, started timestamptz,
                                              finished timestamptz, result jsonb DEFAULT NULL)
    RETURNS queue.history
    LANGUAGE sql
    IMMUTABLE
    PARALLEL SAFE
AS $$
    SELECT ROW((task).id, (task).stage, status, (task).priority, (task).run_at, (task).payload, (task).key,
               attempt, worker, error_text, (task).created, started, finished, (task).group_key, (task).run_as,
               result)::queue.history
$$;
COMMENT ON FUNCTION queue._history_row(queue.live_tasks, queue.task_status, integer, text, text, timestamptz, timestamptz, jsonb) IS 'Internal: the queue.history row of a task that ends (status, attempt, worker, error_text, started, finished, result as given; the rest from the task).';
REVOKE ALL ON FUNCTION queue._history_row(queue.live_tasks, queue.task_status, integer, text, text, timestamptz, timestamptz, jsonb) FROM PUBLIC;
