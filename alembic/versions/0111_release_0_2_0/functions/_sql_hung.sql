-- _sql_hung(): running SQL tasks of the caller's login role that ignored the watchdog's cancel: it
-- signalled them (their `updated` past the timeout, see _sql_overdue) 5 seconds ago or more and
-- they still run (a request may catch query_canceled). Each with its stage, the pid of the executor
-- backend that took it (from its worker name) and when it took it, for cancel_overdue_sql_tasks,
-- which terminates that backend as the last resort. The caller checks the pid against
-- pg_stat_activity. Reads queue.live_tasks; writes nothing.
CREATE OR REPLACE FUNCTION queue._sql_hung()
    RETURNS TABLE (id bigint, stage text, pid integer, started timestamptz)
    LANGUAGE sql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT t.id, t.stage, pg_catalog.substring(t.worker, '#([0-9]{1,9})$')::integer, t.started
      FROM queue.live_tasks t
     WHERE t.status = 'running'
       -- by exact name: a cast of the name to regrole would parse it as SQL input
       AND t.run_as = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = SESSION_USER)::regrole
       AND t.updated > t.started + coalesce((t.payload ->> 'timeout')::interval,
                                            (queue._settings(t.stage)).lease_duration)
       AND t.updated <= pg_catalog.now() - interval '5 seconds'
$$;
COMMENT ON FUNCTION queue._sql_hung() IS 'Internal, for cancel_overdue_sql_tasks (role skiplock_sql): running SQL tasks of the caller''s login role still running 5 s or more after the watchdog cancelled them, with the pid of their executor backend.';
REVOKE ALL ON FUNCTION queue._sql_hung() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._sql_hung() TO skiplock_sql;
