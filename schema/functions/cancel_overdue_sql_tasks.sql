-- cancel_overdue_sql_tasks(): the SQL tasks' watchdog. Cancels (pg_cancel_backend) the statement of
-- every running SQL task of the caller's login role past its timeout; run_sql_tasks records it as
-- failed with SQLSTATE 57014. statement_timeout covers a whole CALL, not each task in it, so the
-- per-task timeout needs a second session: `skiplock run-sql` calls this twice a second; with
-- pg_cron, schedule it every few seconds. SECURITY INVOKER: it signals the executors' backends,
-- which are the caller's own (executors log in as the role whose tasks they run).
-- Returns how many statements it cancelled. Writes queue.live_tasks (updated, via _sql_overdue).
CREATE OR REPLACE FUNCTION queue.cancel_overdue_sql_tasks()
    RETURNS integer
    LANGUAGE sql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
    -- A backend that started after the task took it is not its executor (a recycled pid).
    SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_cancel_backend(a.pid))::integer
      FROM queue._sql_overdue() o
      JOIN pg_catalog.pg_stat_activity a ON a.pid = o.pid AND a.backend_start <= o.started
$$;
COMMENT ON FUNCTION queue.cancel_overdue_sql_tasks() IS 'The SQL tasks'' watchdog: cancels the statement of every running SQL task of the caller''s login role past its timeout (run_sql_tasks records 57014) and returns how many. Run it every few seconds, logged in as the executors are (SECURITY INVOKER).';
REVOKE ALL ON FUNCTION queue.cancel_overdue_sql_tasks() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.cancel_overdue_sql_tasks() TO skiplock_sql;
