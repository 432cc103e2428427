-- _count_runs(stage, status, runs): count runs of a stage that ended in status without a row in
-- queue.history (the task's history mode is 'none', or 'failures' and the run did not fail). Adds
-- them to this backend's row of queue.finished_counts for the current minute: an UPDATE, else an
-- insert; concurrent finishes write rows of their own, never one hot row. Returns false, so that a
-- statement can call it in the WHERE of its INSERT into queue.history for the rows it leaves out.
-- consume, drain, finish_batch and reap_hung count the same way inside their statements.
-- Writes queue.finished_counts (locks this backend's row); raises nothing of its own.
CREATE OR REPLACE FUNCTION queue._count_runs(stage text, status queue.task_status, runs bigint DEFAULT 1)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_minute  timestamptz := queue._count_minute();
    v_backend integer := pg_catalog.pg_backend_pid();
BEGIN
    UPDATE queue.finished_counts c
       SET runs = c.runs OPERATOR(pg_catalog.+) _count_runs.runs
     WHERE c.stage = _count_runs.stage AND c.status = _count_runs.status AND c.minute = v_minute AND c.backend = v_backend;
    IF NOT FOUND THEN
        INSERT INTO queue.finished_counts AS c (stage, status, minute, backend, runs)
        VALUES (_count_runs.stage, _count_runs.status, v_minute, v_backend, _count_runs.runs)
        ON CONFLICT ON CONSTRAINT finished_counts_pkey DO UPDATE
           SET runs = c.runs OPERATOR(pg_catalog.+) excluded.runs;
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION queue._count_runs(text, queue.task_status, bigint) IS 'Internal: counts runs that end without a history row (history ''none'' or ''failures'') in this backend''s row of queue.finished_counts for the minute. Returns false (for the WHERE of an INSERT into history).';
REVOKE ALL ON FUNCTION queue._count_runs(text, queue.task_status, bigint) FROM PUBLIC;
