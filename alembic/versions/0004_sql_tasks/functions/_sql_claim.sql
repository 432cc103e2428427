-- _sql_claim(stage, worker): run_sql_tasks' first step: take the next due SQL task of a stage
-- (take_next, so priorities, pauses, max_running and stage access hold) and return what the
-- executor needs to run it. The worker name records the executor's backend pid ('name#pid'), so
-- that cancel_overdue_sql_tasks can find it; the lease covers the task's timeout (or the stage's
-- lease_duration) plus 30 s, so reap_hung leaves it to the watchdog. An ordinary task found in the
-- stage is made fatal ('not an SQL task') and the next is taken.
-- Locks the claimed row; writes queue.live_tasks (and history for non-SQL tasks).
CREATE OR REPLACE FUNCTION queue._sql_claim(stage text, worker text DEFAULT NULL)
    RETURNS TABLE (id bigint, lease uuid, request text, run_as text, timeout interval, attempt integer,
                   started timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_worker text := pg_catalog.format('%s#%s', pg_catalog.left(coalesce(_sql_claim.worker, 'sql'), 180),
                                       pg_catalog.pg_backend_pid());
    v_task   record;
    v_owner  regrole;
    v_limit  interval;
BEGIN
    LOOP
        SELECT k.id, k.lease, k.payload, k.attempt INTO v_task
          FROM queue.take_next(_sql_claim.stage, 1, NULL, v_worker) k;
        IF v_task.id IS NULL THEN
            RETURN;
        END IF;
        SELECT t.run_as INTO v_owner FROM queue.live_tasks t WHERE t.id = v_task.id;
        IF v_owner IS NOT NULL THEN
            EXIT;
        END IF;
        PERFORM queue.fail(v_task.id, v_task.lease,
                           'not an SQL task: run_sql_tasks runs only tasks added with enqueue_sql', fatal => true);
    END LOOP;

    v_limit := coalesce((v_task.payload ->> 'timeout')::interval, (queue._settings(_sql_claim.stage)).lease_duration);
    PERFORM queue.heartbeat(v_task.id, v_task.lease, v_limit + interval '30 seconds');
    id      := v_task.id;
    lease   := v_task.lease;
    request := v_task.payload ->> 'sql';
    run_as  := (SELECT r.rolname::text FROM pg_catalog.pg_roles r WHERE r.oid = v_owner);
    timeout := v_limit;
    attempt := v_task.attempt;
    started := pg_catalog.now();
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION queue._sql_claim(text, text) IS 'Internal, for run_sql_tasks (role skiplock_sql_executor): takes the next due SQL task of a stage and returns its id, lease, request, the role to run it as (NULL if that role was dropped), its timeout, attempt and start time. Ordinary tasks found in the stage are made fatal.';
REVOKE ALL ON FUNCTION queue._sql_claim(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._sql_claim(text, text) TO skiplock_sql_executor;

