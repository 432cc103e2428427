-- _sql_stopping(id, lease): run_sql_tasks' step between a request and its record: was the
-- executor asked to stop (stop_sql_executor marked the task's worker 'name#pid (stopping)')? Locks
-- the task's row first, so a stop request still in flight (it marks, then cancels, then commits)
-- is waited for and seen, and none can mark the row after this (its mark would wait for the
-- record, and then find the task no longer running). Clears the mark, so the worker in the history
-- row is the executor's own.
-- Returns false when the lease is not current (the task was reaped or cancelled).
-- Locks the task's row (run_sql_tasks records it in the same transaction).
CREATE OR REPLACE FUNCTION queue._sql_stopping(id bigint, lease uuid)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_worker text;
BEGIN
    SELECT t.worker INTO v_worker
      FROM queue.live_tasks t
     WHERE t.id = _sql_stopping.id AND t.lease = _sql_stopping.lease AND t.run_as IS NOT NULL
       FOR UPDATE;
    IF NOT FOUND OR v_worker IS NULL OR v_worker !~ '#[0-9]{1,9} \(stopping\)$' THEN
        RETURN false;
    END IF;
    UPDATE queue.live_tasks t
       SET worker = pg_catalog.substring(v_worker, '^(.*#[0-9]{1,9}) \(stopping\)$')
     WHERE t.id = _sql_stopping.id;
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue._sql_stopping(bigint, uuid) IS 'Internal, for run_sql_tasks (role skiplock_sql): whether stop_sql_executor marked the task as stopping (waits for one in flight); clears the mark and keeps the row locked. False when the lease is not current.';
REVOKE ALL ON FUNCTION queue._sql_stopping(bigint, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._sql_stopping(bigint, uuid) TO skiplock_sql;
