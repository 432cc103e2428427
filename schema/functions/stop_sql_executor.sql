-- stop_sql_executor(pid): ask the SQL executor running in backend `pid` to stop: the statement
-- it runs is cancelled, its task handed back (release: ready again, the attempt not counted) and
-- its CALL returns. A cancel alone cannot say this, and nothing that ends with the caller's session
-- may say it either (the executor may look only after that session is gone). So the request is
-- written down first, in the task's row (_sql_stop_mark: its worker becomes 'name#pid (stopping)'),
-- and only then is the statement cancelled: run_sql_tasks reads the mark with a row lock, which
-- waits for this transaction, so it sees the stop once this transaction commits, however soon the
-- caller disconnects after. The executor then hands its task back (or, when the request had
-- already ended, records it as usual) and its CALL returns. An executor between tasks has no row
-- to mark: the cancel reaches its claim or its cleanup, and it returns; _sql_stop_mark's
-- transaction lock (1936419948, pid) keeps it from claiming a task before the cancel arrives.
-- Any other cancel, such as a request cancelling itself, is the task's error.
-- Takes effect when the caller's transaction commits (call it in autocommit or commit soon: until
-- then the stopped executor waits); READ COMMITTED only (22023 otherwise).
-- SECURITY INVOKER: it signals the caller's own executors (pg_cancel_backend's rule: the same role,
-- or pg_signal_backend); _sql_stop_mark marks only tasks the caller could cancel so.
-- Returns whether the signal was sent.
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
    -- First the mark (committed with this transaction), then the signal: never the other way round.
    PERFORM queue._sql_stop_mark(stop_sql_executor.pid);
    RETURN pg_catalog.pg_cancel_backend(stop_sql_executor.pid);
END
$$;
COMMENT ON FUNCTION queue.stop_sql_executor(integer) IS 'Asks the SQL executor in backend pid (the caller''s own) to stop: its task is marked as stopping, then its statement cancelled; the task is handed back without counting the attempt and its CALL returns, whenever the caller''s session ends. Takes effect when the caller''s transaction commits.';
REVOKE ALL ON FUNCTION queue.stop_sql_executor(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.stop_sql_executor(integer) TO skiplock_sql;
