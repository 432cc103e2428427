-- _sql_stop_mark(pid): stop_sql_executor's first step: write the stop request down where it
-- outlives the caller's session. The running SQL task of executor backend `pid` (worker
-- 'name#pid', written by _sql_claim) gets worker 'name#pid (stopping)'; run_sql_tasks reads and
-- clears the mark (_sql_stopping) before it records the task. The mark is a row change, so it is
-- seen once the caller's transaction commits, and the executor's read of it waits for that.
-- First it takes the transaction lock (1936419948, pid), which _sql_claim takes (shared) around
-- every claim: a claim under way ends before the row is looked for (so its task is marked), and
-- none starts before this transaction ends (by then the cancel that follows has reached the
-- executor, in its cleanup or in that claim: it returns without a task).
-- Only tasks the caller could cancel are marked, by pg_cancel_backend's rule with the login role
-- (SESSION_USER, as elsewhere in skiplock): the task's role or a role it is a member of, or
-- pg_signal_backend (not for a superuser's tasks); a superuser any. Nothing else changes: the
-- watchdog, reading the pid from the end of worker, leaves a stopping task alone.
-- READ COMMITTED only: under REPEATABLE READ the search would use a snapshot taken before the
-- lock, and miss a task claimed meanwhile.
-- Returns how many rows it marked (0 or 1; more only for rows of a dead backend with the same pid).
-- Locks the marked row and the advisory lock (1936419948, pid) until the transaction ends.
CREATE OR REPLACE FUNCTION queue._sql_stop_mark(pid integer)
    RETURNS integer
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_super  boolean := (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = SESSION_USER);
    v_signal boolean := pg_catalog.pg_has_role(SESSION_USER, 'pg_signal_backend', 'USAGE');
    v_marked integer;
BEGIN
    IF _sql_stop_mark.pid IS NULL THEN
        RAISE EXCEPTION 'pid must not be NULL'
            USING ERRCODE = '22004', HINT = 'Pass the executor''s backend pid (pg_backend_pid() in its session).';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'stop_sql_executor needs READ COMMITTED'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The transaction is %s.', pg_catalog.current_setting('transaction_isolation')),
                  HINT = 'Call it in a transaction of its own (autocommit) at READ COMMITTED.';
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(1936419948, _sql_stop_mark.pid);
    -- A statement of its own, after the lock: its snapshot sees every claim that ended before.
    UPDATE queue.live_tasks t
       SET worker = t.worker || ' (stopping)'
      FROM pg_catalog.pg_roles r
     WHERE t.status = 'running' AND t.run_as IS NOT NULL
       AND t.worker ~ ('#' || _sql_stop_mark.pid::text || '$')
       AND r.oid = t.run_as
       AND (v_super OR (NOT r.rolsuper AND (v_signal OR pg_catalog.pg_has_role(SESSION_USER, r.oid, 'MEMBER'))));
    GET DIAGNOSTICS v_marked = ROW_COUNT;
    RETURN v_marked;
END
$$;
COMMENT ON FUNCTION queue._sql_stop_mark(integer) IS 'Internal, for stop_sql_executor (role skiplock_sql): marks the running SQL task of executor backend pid as stopping (worker ''name#pid (stopping)''), if the caller may cancel that backend; holds the transaction lock (1936419948, pid) that keeps the executor from claiming meanwhile. Returns how many it marked.';
REVOKE ALL ON FUNCTION queue._sql_stop_mark(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._sql_stop_mark(integer) TO skiplock_sql;
