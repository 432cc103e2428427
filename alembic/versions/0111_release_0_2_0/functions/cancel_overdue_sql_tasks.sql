-- cancel_overdue_sql_tasks(): the SQL tasks' watchdog. Cancels (pg_cancel_backend) the statement of
-- every running SQL task of the caller's login role past its timeout; run_sql_tasks records it as
-- failed with SQLSTATE 57014. statement_timeout covers a whole CALL, not each task in it, so the
-- per-task timeout needs a second session: `skiplock run-sql` calls this twice a second; with
-- pg_cron, schedule it every few seconds. A request may catch query_canceled and go on: one still
-- running 5 s on from a cancel (_sql_hung) has its executor's session terminated, the last resort
-- (pg_terminate_backend, waiting up to 5 s for the session to end, which rolls the request back),
-- and its attempt recorded as timed out (57014, _sql_timed_out). SECURITY INVOKER: it signals the
-- executors' backends, which are the caller's own (executors log in as the role whose tasks they
-- run). Returns how many statements it cancelled or terminated. Writes queue.live_tasks (updated,
-- via _sql_overdue; a terminated task's attempt, via _sql_timed_out) and queue.history when fatal.
CREATE OR REPLACE FUNCTION queue.cancel_overdue_sql_tasks()
    RETURNS integer
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hung  record;
    v_count integer := 0;
BEGIN
    -- A backend that started after the task took it is not its executor (a recycled pid); a task
    -- whose executor is gone is reap_hung's, when its lease ends.
    FOR v_hung IN
        SELECT h.id, h.stage, h.pid, h.started
          FROM queue._sql_hung() h
          JOIN pg_catalog.pg_stat_activity a ON a.pid = h.pid AND a.backend_start <= h.started
    LOOP
        IF pg_catalog.pg_terminate_backend(v_hung.pid, 5000) THEN
            PERFORM queue._sql_timed_out(v_hung.id, v_hung.stage, v_hung.started);
            v_count := v_count + 1;
        END IF;
    END LOOP;
    SELECT v_count + pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_cancel_backend(a.pid))::integer INTO v_count
      FROM queue._sql_overdue() o
      JOIN pg_catalog.pg_stat_activity a ON a.pid = o.pid AND a.backend_start <= o.started;
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION queue.cancel_overdue_sql_tasks() IS 'The SQL tasks'' watchdog: cancels the statement of each running SQL task of the caller''s login role past its timeout; 5 s on, terminates the session of one that ignored it (recorded 57014). Returns how many. SECURITY INVOKER.';
REVOKE ALL ON FUNCTION queue.cancel_overdue_sql_tasks() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.cancel_overdue_sql_tasks() TO skiplock_sql;
