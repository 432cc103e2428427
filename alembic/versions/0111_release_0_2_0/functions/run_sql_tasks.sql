-- run_sql_tasks(stage, max_tasks, worker, ran): the SQL tasks' executor. Runs, one after another, up
-- to max_tasks due SQL tasks of a stage that the session's login role enqueued (an executor logs in
-- as that role, so a request has exactly its privileges). Per task: the claim commits; the request
-- runs, then its deferred constraints (SET CONSTRAINTS ALL IMMEDIATE), so their errors are the
-- task's; the outcome commits with the request's effects; the session is cleaned (temp objects,
-- settings, advisory locks) in a transaction of its own. A query's rows are kept as jsonb with
-- column names and types; other statements report their command and row count. Errors go to fail()
-- with their SQLSTATE; a cancel past the timeout is 57014; a stop_sql_executor stop hands the task
-- back (release) and returns. INOUT ran: how many it ran. SECURITY INVOKER (it commits): needs
-- skiplock_sql; CALL it outside a transaction block. Raises 22023 for max_tasks < 1, 42501 under
-- SET ROLE. Locks each claimed row in turn; writes queue.live_tasks and queue.history. It cannot
-- pin search_path (it commits): every operator, function and type outside the request is qualified
-- and exact-typed (OPERATOR(pg_catalog.=) with casts), so nothing on the caller's path runs here.
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
    v_message text;
    v_detail  text;
    v_stop    boolean;
    v_rows    bigint;
    v_json    json;
    v_columns jsonb;
    v_read    text := 'SELECT pg_catalog.json_agg(pg_catalog.row_to_json(r)) FROM pg_temp.skiplock_sql_result r';
BEGIN
    IF run_sql_tasks.max_tasks IS NULL OR run_sql_tasks.max_tasks OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'max_tasks must be at least 1'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('max_tasks is %s.'::pg_catalog.text, coalesce(run_sql_tasks.max_tasks::pg_catalog.text, 'NULL')),
                  HINT = 'Give how many tasks this call may run before it returns, e.g. 10.';
    END IF;
    IF CURRENT_USER OPERATOR(pg_catalog.<>) SESSION_USER THEN
        RAISE EXCEPTION 'run_sql_tasks must not run under SET ROLE'
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('The session is %s, acting as %s.'::pg_catalog.text, SESSION_USER, CURRENT_USER),
                  HINT = 'Log in as the role whose SQL tasks to run (tasks run with the privileges of the role that enqueued them, as its own session).';
    END IF;
    ran := 0;
    WHILE ran OPERATOR(pg_catalog.<) run_sql_tasks.max_tasks LOOP
        v_task := NULL;
        BEGIN
            SELECT c.* INTO v_task FROM queue._sql_claim(run_sql_tasks.stage, run_sql_tasks.worker) c;
        EXCEPTION WHEN query_canceled THEN
            EXIT;  -- told to stop before anything was claimed
        END;
        EXIT WHEN v_task.id IS NULL;
        COMMIT;

        v_result := NULL; v_error := NULL; v_stop := false; v_json := NULL; v_columns := NULL;
        BEGIN
            BEGIN
                EXECUTE 'CREATE TEMP TABLE skiplock_sql_result ON COMMIT DROP AS ' OPERATOR(pg_catalog.||) v_task.request;
            EXCEPTION
                WHEN syntax_error THEN
                    -- Not a query (DML without RETURNING to keep, DDL, CALL): run it as it is.
                    EXECUTE v_task.request;
                    GET DIAGNOSTICS v_rows = ROW_COUNT;
                    v_result := pg_catalog.jsonb_build_object(
                        'command', pg_catalog.upper(pg_catalog.substring(v_task.request, '^\s*([A-Za-z]+)'::pg_catalog.text)),
                        'row_count', v_rows);
                WHEN duplicate_column OR invalid_table_definition THEN
                    -- SELECT 1, 2 or SELECT pg_sleep(1) (a void column): no table can hold it;
                    -- keep the rows and the names, not the types.
                    EXECUTE 'SELECT pg_catalog.json_agg(pg_catalog.row_to_json(q)) FROM (' OPERATOR(pg_catalog.||) v_task.request
                            OPERATOR(pg_catalog.||) ') q' INTO v_json;
                    SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('name', j.key, 'type', NULL) ORDER BY j.n)
                      INTO v_columns
                      FROM pg_catalog.json_each(v_json OPERATOR(pg_catalog.->) 0) WITH ORDINALITY j(key, value, n);
                    v_columns := coalesce(v_columns, '[]');
            END;
            IF v_result IS NULL THEN
                IF v_columns IS NULL THEN
                    SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('name', a.attname, 'type', pg_catalog.format_type(a.atttypid, a.atttypmod)) ORDER BY a.attnum), '[]')
                      INTO v_columns
                      FROM pg_catalog.pg_attribute a
                     WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('pg_temp.skiplock_sql_result'::pg_catalog.text)::pg_catalog.oid
                       AND a.attnum OPERATOR(pg_catalog.>) 0::pg_catalog.int2 AND NOT a.attisdropped;
                    EXECUTE v_read INTO v_json;  -- a variable: the table exists only at run time
                END IF;
                -- Rows as arrays in column order (json, unlike jsonb, keeps order and repeated names).
                v_result := pg_catalog.jsonb_build_object(
                    'columns', v_columns,
                    'rows', coalesce((SELECT pg_catalog.jsonb_agg(coalesce((SELECT pg_catalog.jsonb_agg(j.value::pg_catalog.jsonb ORDER BY j.n)
                                                                              FROM pg_catalog.json_each(e.value) WITH ORDINALITY j(key, value, n)), '[]') ORDER BY e.n)
                                        FROM pg_catalog.json_array_elements(v_json) WITH ORDINALITY e(value, n)), '[]'),
                    'row_count', coalesce(pg_catalog.json_array_length(v_json), 0));
            END IF;
            -- Deferred constraints fire now, so that their errors are the task's.
            SET CONSTRAINTS ALL IMMEDIATE;
        EXCEPTION
            WHEN query_canceled THEN
                -- The watchdog past the timeout, or a stop request before it; a request that
                -- raises 57014 itself, or its own statement_timeout, is an ordinary error.
                v_message := SQLERRM;
                IF v_message OPERATOR(pg_catalog.=) 'canceling statement due to user request'::pg_catalog.text
                   AND pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) (v_task.started OPERATOR(pg_catalog.+) v_task.timeout)
                   AND EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                                WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'::pg_catalog.text
                                  AND l.classid OPERATOR(pg_catalog.=) 1936419948::pg_catalog.oid
                                  AND l.objid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()::pg_catalog.oid
                                  AND l.objsubid OPERATOR(pg_catalog.=) 2::pg_catalog.int2
                                  AND l.granted AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()) THEN
                    v_stop := true;  -- stop_sql_executor
                ELSIF v_message OPERATOR(pg_catalog.=) 'canceling statement due to user request'::pg_catalog.text
                      AND pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) (v_task.started OPERATOR(pg_catalog.+) v_task.timeout) THEN
                    v_error := pg_catalog.format('57014: %s (timeout %s)'::pg_catalog.text, v_message, v_task.timeout);
                ELSE
                    v_error := pg_catalog.format('57014: %s'::pg_catalog.text, v_message);
                END IF;
            WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL;
                v_error := pg_catalog.format('%s: %s'::pg_catalog.text, SQLSTATE, v_message)
                        OPERATOR(pg_catalog.||) CASE WHEN v_detail OPERATOR(pg_catalog.<>) ''::pg_catalog.text
                                                     THEN pg_catalog.format(' (%s)'::pg_catalog.text, v_detail) ELSE '' END;
        END;
        -- A request's SET ROLE outlives it; record as the session's own role.
        RESET ROLE;

        LOOP
            BEGIN
                PERFORM queue._sql_record(v_task.id, v_task.lease, v_result, v_error, v_stop);
                EXIT;
            EXCEPTION WHEN query_canceled THEN
                NULL;  -- a signal meant for the request arrived late: record again
            END;
        END LOOP;
        COMMIT;
        ran := ran OPERATOR(pg_catalog.+) 1;

        -- Nothing the request left in the session reaches the next task.
        LOOP
            BEGIN
                DISCARD TEMP;
                RESET ALL;
                PERFORM pg_catalog.pg_advisory_unlock_all();
                EXIT;
            EXCEPTION WHEN query_canceled THEN
                NULL;
            END;
        END LOOP;
        COMMIT;
        EXIT WHEN v_stop;
    END LOOP;
END
$$;
COMMENT ON PROCEDURE queue.run_sql_tasks(text, integer, text, integer) IS 'The SQL tasks'' executor: CALL queue.run_sql_tasks(''reports'', 10) runs up to 10 due SQL tasks of the stage enqueued by the session''s login role (no SET ROLE), committing after each; results go to history, errors to fail(). Returns ran.';
REVOKE ALL ON PROCEDURE queue.run_sql_tasks(text, integer, text, integer) FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE queue.run_sql_tasks(text, integer, text, integer) TO skiplock_sql;
