-- _sql_timed_out(id, stage, started): record as timed out the attempt of an SQL task of the caller's
-- login role that started at `started`, once cancel_overdue_sql_tasks has terminated its executor's
-- session (the request's transaction, and with it its effects, rolled back). As fail(): retried or
-- fatal by the stage's policy, the error '57014: … timeout …'. Returns false, changing nothing,
-- when that attempt is no longer running (its executor recorded it first).
-- Locks the task's row; writes queue.live_tasks, and queue.history when fatal.
CREATE OR REPLACE FUNCTION queue._sql_timed_out(id bigint, stage text, started timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_task queue.live_tasks;
BEGIN
    SELECT t.* INTO v_task
      FROM queue.live_tasks t
     WHERE t.id = _sql_timed_out.id AND t.stage = _sql_timed_out.stage AND t.status = 'running'
       AND t.started = _sql_timed_out.started
       AND t.run_as = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = SESSION_USER)::regrole
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    RETURN queue.fail(v_task.id, v_task.lease,
                      pg_catalog.format('57014: canceling statement due to user request (timeout %s); the request '
                                        'ignored the cancel and its session was terminated',
                                        coalesce((v_task.payload ->> 'timeout')::interval,
                                                 (queue._settings(v_task.stage)).lease_duration)),
                      stage => v_task.stage);
END
$$;
COMMENT ON FUNCTION queue._sql_timed_out(bigint, text, timestamptz) IS 'Internal, for cancel_overdue_sql_tasks (role skiplock_sql): fails as timed out (57014) the attempt of an SQL task of the caller''s login role whose executor session it terminated. False when that attempt no longer runs.';
REVOKE ALL ON FUNCTION queue._sql_timed_out(bigint, text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._sql_timed_out(bigint, text, timestamptz) TO skiplock_sql;
