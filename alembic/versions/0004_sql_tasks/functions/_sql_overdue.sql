-- _sql_overdue(): running SQL tasks past their timeout (or the stage's lease_duration), with the
-- pid of the executor backend that took each (from its worker name) and when it took it. Reads
-- only running rows. The caller checks the pid against pg_stat_activity, which shows another
-- role's backend_start only to that role (or pg_read_all_stats).
CREATE OR REPLACE FUNCTION queue._sql_overdue()
    RETURNS TABLE (id bigint, pid integer, started timestamptz)
    LANGUAGE sql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT t.id, pg_catalog.substring(t.worker, '#([0-9]{1,9})$')::integer, t.started
      FROM queue.live_tasks t
     WHERE t.status = 'running' AND t.run_as IS NOT NULL
       AND t.started + coalesce((t.payload ->> 'timeout')::interval,
                                (queue._settings(t.stage)).lease_duration) < pg_catalog.now()
$$;
COMMENT ON FUNCTION queue._sql_overdue() IS 'Internal, for cancel_overdue_sql_tasks (role skiplock_sql_executor): running SQL tasks past their timeout, the pid of the executor backend that took each and when.';
REVOKE ALL ON FUNCTION queue._sql_overdue() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._sql_overdue() TO skiplock_sql_executor;
