-- stop_sql_executor(pid): ask the SQL executor running in backend `pid` to stop: the statement it
-- runs is cancelled, its task handed back (release: ready again, the attempt not counted) and its
-- CALL returns. run_sql_tasks counts as a stop only a cancel before the task's timeout while another
-- session holds advisory lock (1936419948, pid), which this takes for the rest of the caller's
-- session; any other cancel is the task's error. After the signal it waits, at most 1 s, until the
-- executor's CALL has returned (its state in pg_stat_activity), so that a caller that disconnects at
-- once still counts; for another role's executor it cannot see that and returns at once.
-- SECURITY INVOKER: it signals the caller's own executors. Returns whether the signal was sent.
-- Raises 22004 for a NULL pid, 22023 for the caller's own pid, 42501 for another role's backend
-- (pg_cancel_backend's); a refused call, or one that signalled nothing, leaves no lock behind.
CREATE OR REPLACE FUNCTION queue.stop_sql_executor(pid integer)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_until timestamptz;
    v_sent  boolean;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN stop_sql_executor.pid IS NULL OR stop_sql_executor.pid = pg_catalog.pg_backend_pid() THEN 'pid' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('stop_sql_executor', v_bad, pg_catalog.jsonb_build_object(
            'pid', stop_sql_executor.pid::text));
    END IF;
    -- </arguments>
    PERFORM pg_catalog.pg_advisory_lock(1936419948, stop_sql_executor.pid);
    BEGIN
        v_sent := pg_catalog.pg_cancel_backend(stop_sql_executor.pid);
    EXCEPTION WHEN OTHERS THEN  -- 42501: another role's backend
        PERFORM pg_catalog.pg_advisory_unlock(1936419948, stop_sql_executor.pid);
        RAISE;
    END;
    IF NOT v_sent THEN
        PERFORM pg_catalog.pg_advisory_unlock(1936419948, stop_sql_executor.pid);
        RETURN false;
    END IF;
    -- Keep the lock until the executor has seen it: its CALL returns once it has handed the task back.
    v_until := pg_catalog.clock_timestamp() + interval '1 second';
    LOOP
        PERFORM pg_catalog.pg_stat_clear_snapshot();  -- else pg_stat_activity stays as first read
        EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a
                               WHERE a.pid = stop_sql_executor.pid AND a.state = 'active')
               OR pg_catalog.clock_timestamp() >= v_until;
        PERFORM pg_catalog.pg_sleep(0.005);
    END LOOP;
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue.stop_sql_executor(integer) IS 'Asks the SQL executor in backend pid (the caller''s own) to stop: its statement is cancelled, its task handed back without counting the attempt. Holds advisory lock (1936419948, pid) for the session and waits up to 1 s for the executor.';
REVOKE ALL ON FUNCTION queue.stop_sql_executor(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.stop_sql_executor(integer) TO skiplock_sql;
