-- run_sql_tasks(stage, max_tasks, worker, ran): the SQL tasks' executor. Runs up to max_tasks due
-- SQL tasks of a stage, one after another, each in its own transactions: the claim is committed
-- first (the task is running, leased), then the request runs as the role that enqueued it and
-- its outcome is committed. Returns (INOUT ran) how many it ran; fewer than max_tasks means the
-- stage had no more due tasks. Call it with CALL, outside an explicit transaction block.
-- How a request runs: SET ROLE to the enqueuing role, create a SECURITY DEFINER function in
-- pg_temp owned by that role, RESET ROLE, call it. Inside a SECURITY DEFINER function SET ROLE,
-- RESET ROLE and SET SESSION AUTHORIZATION are refused, so the request cannot take the
-- executor's privileges; it runs with search_path "$user", public. A query's rows are kept
-- (CREATE TEMP TABLE AS), other statements report their row count. Errors are caught with their
-- SQLSTATE and recorded with fail() (the stage's retry policy decides); a statement cancelled
-- past its timeout (cancel_overdue_sql_tasks) is recorded as 57014; one cancelled before its
-- timeout (the executor is stopping) is handed back with release(). After each task the
-- session is cleaned: temp objects dropped, settings reset, advisory locks released, so
-- nothing carries over to the next task.
-- SECURITY INVOKER (a procedure that commits cannot be SECURITY DEFINER): the caller needs role
-- skiplock_sql_executor, and must be able to SET ROLE to each enqueuing role (a superuser, or a
-- login granted those roles); a task whose role it cannot become fails with 42501.
-- Locks: each claimed row, one at a time.
CREATE OR REPLACE PROCEDURE queue.run_sql_tasks(
        stage     text    DEFAULT 'sql',
        max_tasks integer DEFAULT 100,
        worker    text    DEFAULT NULL,
        INOUT ran integer DEFAULT NULL)
    LANGUAGE plpgsql
AS $$
DECLARE
    v_task    record;
    v_result  jsonb;
    v_error   text;
    v_state   text;
    v_message text;
    v_detail  text;
    v_back    boolean;
    v_call    text := 'SELECT pg_temp.skiplock_sql_task($1)';
BEGIN
    IF run_sql_tasks.max_tasks IS NULL OR run_sql_tasks.max_tasks < 1 THEN
        RAISE EXCEPTION 'max_tasks must be at least 1'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('max_tasks is %s.', coalesce(run_sql_tasks.max_tasks::text, 'NULL')),
                  HINT = 'Give how many tasks this call may run before it returns, e.g. 10.';
    END IF;
    ran := 0;
    WHILE ran < run_sql_tasks.max_tasks LOOP
        v_task := NULL;
        BEGIN
            SELECT c.* INTO v_task FROM queue._sql_claim(run_sql_tasks.stage, run_sql_tasks.worker) c;
        EXCEPTION WHEN query_canceled THEN
            EXIT;  -- a stop request (or a watchdog's late signal) before anything was claimed
        END;
        EXIT WHEN v_task.id IS NULL;
        COMMIT;

        v_result := NULL; v_error := NULL; v_back := false;
        BEGIN
            IF v_task.run_as IS NULL THEN
                RAISE EXCEPTION 'the role that enqueued this task no longer exists'
                    USING ERRCODE = '42704';
            END IF;
            EXECUTE pg_catalog.format('SET ROLE %I', v_task.run_as);
            CREATE FUNCTION pg_temp.skiplock_sql_task(request text)
                RETURNS jsonb
                LANGUAGE plpgsql
                SECURITY DEFINER
                SET search_path = "$user", public
            AS $sandbox$
            DECLARE
                v_rows    bigint;
                v_json    json;
                v_columns jsonb;
            BEGIN
                BEGIN
                    EXECUTE 'CREATE TEMP TABLE skiplock_sql_result ON COMMIT DROP AS ' || request;
                EXCEPTION
                    WHEN syntax_error THEN
                        -- Not a query (DML without RETURNING to keep, DDL, CALL): run it as it is.
                        EXECUTE request;
                        GET DIAGNOSTICS v_rows = ROW_COUNT;
                        RETURN pg_catalog.jsonb_build_object(
                            'command', pg_catalog.upper(pg_catalog.substring(request, '^\s*([A-Za-z]+)')),
                            'row_count', v_rows);
                    WHEN duplicate_column OR invalid_table_definition THEN
                        -- SELECT 1, 2 or SELECT pg_sleep(1) (a void column): no table can hold
                        -- it; keep the rows and the names, not the types.
                        EXECUTE 'SELECT pg_catalog.json_agg(pg_catalog.row_to_json(q)) FROM (' || request || ') q' INTO v_json;
                        SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('name', j.key, 'type', NULL) ORDER BY j.n)
                          INTO v_columns
                          FROM pg_catalog.json_each(v_json -> 0) WITH ORDINALITY j(key, value, n);
                END;
                IF v_json IS NULL THEN
                    SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('name', a.attname, 'type', pg_catalog.format_type(a.atttypid, a.atttypmod)) ORDER BY a.attnum)
                      INTO v_columns
                      FROM pg_catalog.pg_attribute a
                     WHERE a.attrelid = 'pg_temp.skiplock_sql_result'::regclass AND a.attnum > 0 AND NOT a.attisdropped;
                    EXECUTE 'SELECT pg_catalog.json_agg(pg_catalog.row_to_json(r)) FROM pg_temp.skiplock_sql_result r' INTO v_json;
                END IF;
                -- Rows as arrays in column order (json, unlike jsonb, keeps order and repeated names).
                RETURN pg_catalog.jsonb_build_object(
                    'columns', coalesce(v_columns, '[]'),
                    'rows', coalesce((SELECT pg_catalog.jsonb_agg(coalesce((SELECT pg_catalog.jsonb_agg(j.value::jsonb ORDER BY j.n)
                                                                              FROM pg_catalog.json_each(e.value) WITH ORDINALITY j(key, value, n)), '[]') ORDER BY e.n)
                                        FROM pg_catalog.json_array_elements(v_json) WITH ORDINALITY e(value, n)), '[]'),
                    'row_count', coalesce(pg_catalog.json_array_length(v_json), 0));
            END
            $sandbox$;
            RESET ROLE;
            -- Dynamic: the function is new each time (and unknown to a static checker).
            EXECUTE v_call INTO v_result USING v_task.request;
            RESET ALL;
        EXCEPTION
            WHEN query_canceled THEN
                GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
                IF pg_catalog.clock_timestamp() >= v_task.started + v_task.timeout THEN
                    v_error := pg_catalog.format('57014: %s (timeout %s)', v_message, v_task.timeout);
                ELSE
                    v_back := true;
                END IF;
            WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                        v_detail = PG_EXCEPTION_DETAIL;
                v_error := pg_catalog.format('%s: %s', v_state, v_message)
                        || coalesce(' (' || NULLIF(v_detail, '') || ')', '');
        END;
        -- Nothing the request left behind reaches the next task.
        RESET ROLE;
        DISCARD TEMP;
        RESET ALL;
        PERFORM pg_catalog.pg_advisory_unlock_all();

        LOOP
            BEGIN
                PERFORM queue._sql_record(v_task.id, v_task.lease, v_result, v_error, v_back);
                EXIT;
            EXCEPTION WHEN query_canceled THEN
                NULL;  -- a signal meant for the request arrived late: record again
            END;
        END LOOP;
        COMMIT;
        ran := ran + 1;
    END LOOP;
END
$$;
COMMENT ON PROCEDURE queue.run_sql_tasks(text, integer, text, integer) IS 'The SQL tasks'' executor: CALL queue.run_sql_tasks(''reports'', 10) runs up to 10 due SQL tasks of the stage, each as the role that enqueued it, committing after each; rows go to the history row''s result, errors (with SQLSTATE) to fail(), timeouts (cancel_overdue_sql_tasks) are 57014. Returns ran. Needs role skiplock_sql_executor and the right to SET ROLE to the enqueuing roles.';
REVOKE ALL ON PROCEDURE queue.run_sql_tasks(text, integer, text, integer) FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE queue.run_sql_tasks(text, integer, text, integer) TO skiplock_sql_executor;
