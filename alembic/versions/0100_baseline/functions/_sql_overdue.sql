-- _sql_overdue(): running SQL tasks of the caller's login role past their timeout (or the
-- stage's lease_duration), with the pid of the executor backend that took each (from its worker
-- name) and when it took it; each is returned at most once every 5 seconds (its `updated` marks
-- the last time), so that a statement already being cancelled is not signalled again while its
-- executor records it. The caller checks the pid against pg_stat_activity.
-- Writes queue.live_tasks (updated) of the rows it returns.
CREATE OR REPLACE FUNCTION queue._sql_overdue()
    RETURNS TABLE (id bigint, pid integer, started timestamptz)
    LANGUAGE sql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE queue.live_tasks t
       SET updated = pg_catalog.now()
     WHERE t.status = 'running'
       -- by exact name: a cast of the name to regrole would parse it as SQL input
       AND t.run_as = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = SESSION_USER)::regrole
       AND t.started + coalesce((t.payload ->> 'timeout')::interval,
                                (queue._settings(t.stage)).lease_duration) < pg_catalog.now()
       -- not signalled since it went overdue (the claim set updated = started), or over 5 s ago
       AND (t.updated <= t.started + coalesce((t.payload ->> 'timeout')::interval,
                                              (queue._settings(t.stage)).lease_duration)
            OR t.updated < pg_catalog.now() - interval '5 seconds')
    RETURNING t.id, pg_catalog.substring(t.worker, '#([0-9]{1,9})$')::integer, t.started
$$;
COMMENT ON FUNCTION queue._sql_overdue() IS 'Internal, for cancel_overdue_sql_tasks (role skiplock_sql): running SQL tasks of the caller''s login role past their timeout, the pid of the executor backend that took each and when; each at most once per 5 s.';
REVOKE ALL ON FUNCTION queue._sql_overdue() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._sql_overdue() TO skiplock_sql;
