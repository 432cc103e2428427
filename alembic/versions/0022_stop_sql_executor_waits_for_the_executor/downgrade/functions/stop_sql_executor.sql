-- stop_sql_executor(pid): ask the SQL executor running in backend `pid` to stop: the statement
-- it runs is cancelled, its task handed back (release: ready again, the attempt not counted) and
-- its CALL returns. A cancel alone cannot say this: run_sql_tasks counts as a stop only a cancel
-- before the task's timeout while another session holds the advisory lock (1936419948, pid),
-- which this function takes for the rest of the caller's session (or until
-- pg_advisory_unlock(1936419948, pid)); any other cancel, such as a request cancelling itself, is
-- the task's error. SECURITY INVOKER: it signals the caller's own executors. Returns whether the
-- signal was sent.
CREATE OR REPLACE FUNCTION queue.stop_sql_executor(pid integer)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF stop_sql_executor.pid IS NULL THEN
        RAISE EXCEPTION 'pid must not be NULL'
            USING ERRCODE = '22004', HINT = 'Pass the executor''s backend pid (pg_backend_pid() in its session).';
    END IF;
    IF stop_sql_executor.pid = pg_catalog.pg_backend_pid() THEN
        RAISE EXCEPTION 'an executor cannot stop itself this way'
            USING ERRCODE = '22023', HINT = 'Call it from another session of the same role.';
    END IF;
    PERFORM pg_catalog.pg_advisory_lock(1936419948, stop_sql_executor.pid);
    RETURN pg_catalog.pg_cancel_backend(stop_sql_executor.pid);
END
$$;
COMMENT ON FUNCTION queue.stop_sql_executor(integer) IS 'Asks the SQL executor in backend pid (the caller''s own) to stop: its statement is cancelled, its task handed back without counting the attempt, its CALL returns. Holds advisory lock (1936419948, pid) for the caller''s session so that run_sql_tasks can tell this from any other cancel.';
REVOKE ALL ON FUNCTION queue.stop_sql_executor(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.stop_sql_executor(integer) TO skiplock_sql;
