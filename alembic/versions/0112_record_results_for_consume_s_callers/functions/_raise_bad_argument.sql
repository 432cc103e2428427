-- _raise_bad_argument(caller, argument, arguments): the slow path of every argument check
-- (docs/decisions.md, "One way to check an argument"). A function tests its arguments in one CASE
-- at its top that yields the name of the first bad one, and only then calls this with that name
-- and its arguments by name, as text ({"stage": …, "batch": "0"}; SQL NULL as JSON null): the
-- hot path pays one expression. Each argument's error (docs/errors.md) is written here once; a
-- stage name is checked by _check_stage, a stages array by _check_stages, a JSON value (payload,
-- result, progress, result[i]) by _check_payload. A compressed payload, which the guard cannot
-- measure, comes here too: it returns normally when the value fits. Raises 22004, 22023, 54000,
-- or 0A000 for 'limits' (the stage has max_running, group_limit or rate_limit). Reads nothing.
CREATE OR REPLACE FUNCTION queue._raise_bad_argument(caller text, argument text, arguments jsonb)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_given   text := arguments ->> argument;
    v_ord     bigint;
    v_element jsonb;
    v_detail  text;
    v_hint    text;
    v_ids     bigint[];
    v_leases  uuid[];
BEGIN
    IF caller = 'finish_batch' AND argument = 'id, lease' THEN
        v_ids := (arguments ->> 'id')::bigint[];
        v_leases := (arguments ->> 'lease')::uuid[];
        IF pg_catalog.cardinality(v_ids) = pg_catalog.cardinality(v_leases) THEN
            RAISE EXCEPTION 'id and lease must not contain NULL'
                USING ERRCODE = '22004',
                      DETAIL = pg_catalog.format('%s NULL ids, %s NULL leases.',
                                                 (SELECT pg_catalog.count(*) FROM pg_catalog.unnest(v_ids) i WHERE i IS NULL),
                                                 (SELECT pg_catalog.count(*) FROM pg_catalog.unnest(v_leases) l WHERE l IS NULL)),
                      HINT = 'Pass the ids and leases take_next returned, in the same order. Nothing was finished.';
        END IF;
        RAISE EXCEPTION 'id and lease must be arrays of the same length'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s ids, %s leases.', coalesce(pg_catalog.cardinality(v_ids)::text, 'NULL'),
                                             coalesce(pg_catalog.cardinality(v_leases)::text, 'NULL')),
                  HINT = 'Pass the ids and leases take_next returned, in the same order.';
    ELSIF caller = 'finish_batch' AND argument = 'result' THEN
        RAISE EXCEPTION 'result must have one element per id'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s ids, %s results.', pg_catalog.cardinality((arguments ->> 'id')::bigint[]),
                                             pg_catalog.cardinality(v_given::jsonb[])),
                  HINT = 'Pass one result per task, in the order of id (NULL for a task without one), or leave result out.';
    ELSIF caller = 'record_results' AND argument = 'ids, results' THEN
        IF arguments ->> 'ids' IS NULL OR arguments ->> 'results' IS NULL THEN
            RAISE EXCEPTION 'ids and results must not be NULL'
                USING ERRCODE = '22004',
                      DETAIL = pg_catalog.format('record_results was called with %s NULL.',
                                                 pg_catalog.concat_ws(' and ', CASE WHEN arguments ->> 'ids' IS NULL THEN 'ids' END,
                                                                      CASE WHEN arguments ->> 'results' IS NULL THEN 'results' END)),
                      HINT = 'Pass the ids consume returned and one result for each, in the same order.';
        END IF;
        RAISE EXCEPTION 'ids and results must be arrays of the same length'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s ids, %s results.', pg_catalog.cardinality((arguments ->> 'ids')::bigint[]),
                                             pg_catalog.cardinality((arguments ->> 'results')::jsonb[])),
                  HINT = 'Pass one result per id, in the order of ids (NULL for a task without one).';
    ELSIF argument IN ('payloads[i]', 'result[i]', 'results[i]') THEN
        -- The first element that fails, raised as _check_payload raises it, naming its place.
        SELECT p.ord, p.value INTO v_ord, v_element
          FROM pg_catalog.unnest(coalesce(arguments ->> 'payloads', arguments ->> 'result', arguments ->> 'results')::jsonb[])
               WITH ORDINALITY AS p(value, ord)
         WHERE (p.value IS NULL AND argument = 'payloads[i]')
            OR pg_catalog.jsonb_typeof(p.value) NOT IN ('object', 'array') OR pg_catalog.pg_column_size(p.value) > 1048576
         ORDER BY p.ord
         LIMIT 1;
        IF NOT FOUND THEN
            RETURN;  -- only compressed values, which fit
        ELSIF argument IN ('result[i]', 'results[i]') THEN
            PERFORM queue._check_payload(v_element, pg_catalog.format('%s[%s]', pg_catalog.left(argument, -3), v_ord));
        ELSE
            BEGIN
                PERFORM queue._check_payload(v_element);
            EXCEPTION WHEN null_value_not_allowed OR invalid_parameter_value OR program_limit_exceeded THEN
                GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
                RAISE EXCEPTION 'payloads[%]: %', v_ord, SQLERRM
                    USING ERRCODE = SQLSTATE,
                          DETAIL = pg_catalog.concat_ws(' ', pg_catalog.format('Element %s of the array.', v_ord), NULLIF(v_detail, '')),
                          HINT = coalesce(NULLIF(v_hint, ''), 'Every payload must be a JSON object or array of at most 1 MiB.');
            END;
        END IF;
        RETURN;
    END IF;
    IF argument IN ('stage', 'next_stage') THEN
        PERFORM queue._check_stage(v_given, argument);
        RETURN;
    ELSIF argument = 'stages' THEN
        PERFORM queue._check_stages(v_given::text[]);
        RETURN;
    ELSIF argument IN ('payload', 'result', 'progress') OR argument LIKE 'result[%]' THEN
        PERFORM queue._check_payload(v_given::jsonb, argument);
        RETURN;
    END IF;
    CASE argument
    WHEN 'id, lease' THEN
        RAISE EXCEPTION 'id and lease must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('%s was called with id %s and lease %s.', caller,
                                             coalesce(arguments ->> 'id', 'NULL'), coalesce(arguments ->> 'lease', 'NULL')),
                  HINT = 'Pass the id and lease that take_next returned.';
    WHEN 'id' THEN
        RAISE EXCEPTION 'id must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = CASE caller WHEN 'set_priority'
                                THEN pg_catalog.format('set_priority was called with id NULL and priority %s.',
                                                       coalesce(arguments ->> 'priority', 'NULL'))
                                ELSE pg_catalog.format('%s was called with id NULL.', caller) END,
                  HINT = CASE WHEN caller IN ('cancel', 'retry', 'set_priority') THEN 'Pass the id of a task, e.g. from queue.tasks.'
                              ELSE 'Pass the id that take_locked returned.' END;
    WHEN 'fatal' THEN
        RAISE EXCEPTION 'fatal must not be NULL'
            USING ERRCODE = '22004', DETAIL = pg_catalog.format('%s was called with fatal NULL.', caller),
                  HINT = 'Pass fatal => true to end the task for good, or false (the default) to retry it.';
    WHEN 'retry_in' THEN
        RAISE EXCEPTION 'retry_in must not be negative'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('retry_in is %s.', v_given),
                  HINT = CASE caller WHEN 'release' THEN 'Use NULL (the default) to hand the task back at once in its old place.'
                                     ELSE 'Use interval ''0'' to retry at once, or NULL for the stage''s backoff.' END;
    WHEN 'worker' THEN
        RAISE EXCEPTION 'worker name too long'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The worker name has %s characters.', pg_catalog.length(v_given)),
                  HINT = 'Name workers in at most 200 characters, e.g. host:pid.';
    WHEN 'batch' THEN
        RAISE EXCEPTION 'batch out of range'
            USING ERRCODE = '22023',
                  DETAIL = CASE WHEN caller IN ('finish_batch', 'record_results') THEN pg_catalog.format('%s tasks.', v_given)
                                ELSE pg_catalog.format('batch is %s.', coalesce(v_given, 'NULL')) END,
                  HINT = CASE caller WHEN 'consume' THEN 'Consume 1 to 10000 tasks per call.'
                                     WHEN 'finish_batch' THEN 'Finish at most 10000 tasks per call.'
                                     WHEN 'record_results' THEN 'Record at most 10000 results per call.'
                                     ELSE 'Take 1 to 10000 tasks per call.' END;
    WHEN 'lease_for' THEN
        RAISE EXCEPTION 'lease_for must be positive'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('lease_for is %s.', v_given),
                  HINT = CASE caller WHEN 'heartbeat' THEN 'Give the time the worker still needs, or NULL for the stage''s lease_duration.'
                                     ELSE 'Give the time a worker needs for one task, e.g. interval ''5 minutes''.' END;
    WHEN 'priority' THEN
        RAISE EXCEPTION 'priority must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = CASE caller WHEN 'set_priority'
                                THEN pg_catalog.format('set_priority was called with id %s and priority NULL.', arguments ->> 'id')
                                WHEN 'schedule'
                                THEN pg_catalog.format('schedule was called with priority NULL for schedule %s.',
                                                       pg_catalog.quote_literal(arguments ->> 'name'))
                                ELSE pg_catalog.format('%s was called with priority NULL.', caller) END,
                  HINT = 'Lower runs first; the default is 0.';
    WHEN 'drift' THEN
        RAISE EXCEPTION 'drift must not be NULL'
            USING ERRCODE = '22004', DETAIL = pg_catalog.format('%s was called with drift NULL.', caller),
                  HINT = 'true (default): plan the next run from the planned time; false: from the end of the run.';
    WHEN 'mode' THEN
        RAISE EXCEPTION 'unknown enqueue mode'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('mode is %s.',
                                             CASE WHEN v_given IS NULL THEN 'NULL'
                                                  WHEN pg_catalog.length(v_given) <= 80 THEN pg_catalog.quote_literal(v_given)
                                                  ELSE pg_catalog.format('%s... (%s characters)', pg_catalog.quote_literal(pg_catalog.left(v_given, 80)),
                                                                         pg_catalog.length(v_given)) END),
                  HINT = 'Use ''ignore'' (keep the existing task) or ''rerun'' (run it again with the new payload).';
    WHEN 'key' THEN
        RAISE EXCEPTION 'invalid key'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The key has %s characters.', pg_catalog.length(v_given)),
                  HINT = 'A key is 1 to 1000 characters, or NULL for none.';
    WHEN 'repeat' THEN
        RAISE EXCEPTION 'invalid repeat'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('repeat is %s.', v_given),
                  HINT = 'A periodic task repeats every 1 second or more, e.g. interval ''1 hour'', with no negative part (not ''1 day -1 hour''); NULL for a one-off task.';
    WHEN 'group_key' THEN
        RAISE EXCEPTION 'invalid group_key'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The group_key has %s characters.', pg_catalog.length(v_given)),
                  HINT = 'A group_key is 1 to 200 characters, or NULL for none.';
    WHEN 'payloads' THEN
        RAISE EXCEPTION 'payloads must be an array of at most 100000 payloads'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('payloads has %s elements.', coalesce(pg_catalog.cardinality(v_given::jsonb[])::text, 'NULL')),
                  HINT = 'Split larger loads into several calls.';
    WHEN 'finished_id, finished_lease' THEN
        RAISE EXCEPTION 'finished_id and finished_lease must be given together'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('finished_id is %s, finished_lease is %s.', coalesce(arguments ->> 'finished_id', 'NULL'),
                                             coalesce(arguments ->> 'finished_lease', 'NULL')),
                  HINT = 'Pass the id and lease of the task just completed, or both NULL on the first call.';
    WHEN 'now' THEN
        IF v_given IS NULL THEN
            RAISE EXCEPTION 'now must not be NULL'
                USING ERRCODE = '22004', DETAIL = pg_catalog.format('%s was called with now NULL.', caller),
                      HINT = CASE caller WHEN 'maintain' THEN 'Leave now out to maintain as of now().'
                                         WHEN 'rotate_partitions' THEN 'Leave now out to rotate as of now().'
                                         ELSE 'Leave it out to use now().' END;
        END IF;
        RAISE EXCEPTION 'now must be finite'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('now is %s.', v_given),
                  HINT = 'Leave it out to use now().';
    WHEN 'name' THEN
        IF v_given IS NULL THEN
            RAISE EXCEPTION 'name must not be NULL'
                USING ERRCODE = '22004', DETAIL = pg_catalog.format('%s was called with name NULL.', caller),
                      HINT = CASE caller WHEN 'schedule' THEN 'Name the schedule, e.g. ''nightly-report''.'
                                         ELSE 'Give the name the schedule was created with.' END;
        END IF;
        RAISE EXCEPTION 'invalid schedule name'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The name has %s characters.', pg_catalog.length(v_given)),
                  HINT = 'A schedule name is 1 to 200 characters.';
    WHEN 'cron' THEN
        RAISE EXCEPTION 'invalid cron expression'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The expression has %s characters.', pg_catalog.length(v_given)),
                  HINT = 'A cron expression is at most 1000 characters.';
    WHEN 'overlap' THEN
        RAISE EXCEPTION 'overlap must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('schedule was called with overlap NULL for schedule %s.', pg_catalog.quote_literal(arguments ->> 'name')),
                  HINT = 'true fires every tick (the default); false skips a tick while the previous task is live.';
    WHEN 'timezone' THEN
        IF v_given = '' THEN
            RAISE EXCEPTION 'unknown time zone'
                USING ERRCODE = '22023', DETAIL = 'timezone is empty.',
                      HINT = 'Use a name from pg_timezone_names, such as ''UTC'' or ''Europe/Berlin''.';
        END IF;
        RAISE EXCEPTION 'unknown time zone'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('timezone is %s, which is not the name of a time zone.',
                                             CASE WHEN pg_catalog.length(v_given) <= 80 THEN pg_catalog.quote_literal(v_given)
                                                  ELSE pg_catalog.format('%s... (%s characters)', pg_catalog.quote_literal(pg_catalog.left(v_given, 80)),
                                                                         pg_catalog.length(v_given)) END),
                  HINT = 'Use a name from pg_timezone_names, such as ''UTC'' or ''Europe/Berlin''; for a fixed offset, ''Etc/GMT-2'' is UTC+2 (POSIX signs are reversed).';
    WHEN 'role' THEN
        RAISE EXCEPTION 'role must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format(CASE caller WHEN 'grant_stage' THEN 'Granting on stage %s.' ELSE 'Revoking on stage %s.' END,
                                             pg_catalog.quote_literal(arguments ->> 'stage')),
                  HINT = CASE caller WHEN 'grant_stage' THEN 'Name the role (usually a tenant''s group role) whose members may use the stage.'
                                     ELSE 'Name the role to remove from the stage; queue.stage_access lists them.' END;
    WHEN 'enqueue, take' THEN
        RAISE EXCEPTION 'enqueue and take must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('enqueue is %s, take is %s.', coalesce(arguments ->> 'enqueue', 'NULL'),
                                             coalesce(arguments ->> 'take', 'NULL')),
                  HINT = 'Pass true or false for each right; revoke_stage removes a role from the stage.';
    WHEN 'pid' THEN
        IF v_given IS NULL THEN
            RAISE EXCEPTION 'pid must not be NULL'
                USING ERRCODE = '22004', DETAIL = pg_catalog.format('%s was called with pid NULL.', caller),
                      HINT = 'Pass the executor''s backend pid (pg_backend_pid() in its session).';
        END IF;
        RAISE EXCEPTION 'an executor cannot stop itself this way'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('pid %s is this session''s own backend.', v_given),
                  HINT = 'Call it from another session of the same role.';
    WHEN 'max_running' THEN
        RAISE EXCEPTION 'invalid max_running'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('max_running is %s.', v_given),
                  HINT = 'Give the most tasks of the stage that may run at once (1 or more), 0 to remove the cap, or NULL to keep it.';
    WHEN 'rate_limit, rate_burst' THEN
        RAISE EXCEPTION 'invalid rate limit'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('rate_limit is %s, rate_burst %s.', coalesce(arguments ->> 'rate_limit', 'unchanged'), coalesce(arguments ->> 'rate_burst', 'unchanged')),
                  HINT = 'Give the most tasks taken per rate_window (1 or more) and at most that many as rate_burst, 0 to remove either, or NULL to keep it.';
    WHEN 'group_limit' THEN
        RAISE EXCEPTION 'invalid group_limit'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('group_limit is %s.', v_given),
                  HINT = 'Give the most tasks of one group_key that may run at once (1: one at a time), 0 to remove the cap, or NULL to keep it.';
    WHEN 'history' THEN
        RAISE EXCEPTION 'invalid history mode'
            USING ERRCODE = '22023',
                  DETAIL = CASE WHEN v_given IN ('failures', 'none')
                                THEN pg_catalog.format('history %s was given for stage ''*''.', pg_catalog.quote_literal(v_given))
                                ELSE pg_catalog.format('history is %s.', pg_catalog.quote_literal(pg_catalog.left(v_given, 80))) END,
                  HINT = 'Give ''all'' (the default), ''failures'' (keep only fatal ends) or ''none'', for a stage by its name (not ''*''), or NULL to keep it.';
    WHEN 'lease_duration, backoff_base, backoff_cap, task_timeout' THEN
        RAISE EXCEPTION 'invalid stage setting'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('lease_duration %s, backoff_base %s, backoff_cap %s, task_timeout %s.',
                                             coalesce(arguments ->> 'lease_duration', 'unchanged'), coalesce(arguments ->> 'backoff_base', 'unchanged'),
                                             coalesce(arguments ->> 'backoff_cap', 'unchanged'), coalesce(arguments ->> 'task_timeout', 'unchanged')),
                  HINT = 'lease_duration, backoff_base, backoff_cap and task_timeout are at most 100 years.';
    WHEN 'partition_interval, retention' THEN
        RAISE EXCEPTION 'invalid history setting'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('partition_interval is %s, retention %s.', coalesce(arguments ->> 'partition_interval', 'unchanged'), coalesce(arguments ->> 'retention', 'unchanged')),
                  HINT = 'partition_interval in hours or days, no months (1, 2, 3, 4, 6, 8 or 12 hours, 1 day or 7 days); retention at most 1000 years.';
    WHEN 'settings' THEN  -- a CHECK of the table failed: v_given is its message
        IF caller = 'configure_history' THEN
            RAISE EXCEPTION 'invalid history setting'
                USING ERRCODE = '22023', DETAIL = v_given,
                      HINT = 'partition_interval 1, 2, 3, 4, 6, 8 or 12 hours, 1 day or 7 days; premake 1 to 1000; partition_interval <= retention <= 1000 years; retention_action ''drop'' or ''detach''; 0 < rotate_every < partition_interval * premake.';
        END IF;
        RAISE EXCEPTION 'invalid stage setting'
            USING ERRCODE = '22023', DETAIL = v_given,
                  HINT = 'lease_duration > 0 (at most 100 years), max_attempts >= 1, backoff ''linear'' or ''exponential'', delays >= 0, jitter between 0 and 1, '
                         || 'rate_window 1 ms to 31 days without months, rate_burst at most rate_limit, weight 1 to 1000, task_timeout >= 0 (0 removes it).';
    WHEN 'request' THEN
        IF v_given IS NULL OR pg_catalog.btrim(v_given, E' \t\r\n;') = '' THEN
            RAISE EXCEPTION 'request must be an SQL statement'
                USING ERRCODE = CASE WHEN v_given IS NULL THEN '22004' ELSE '22023' END,
                      DETAIL = pg_catalog.format('request is %s.',
                                                 CASE WHEN v_given IS NULL THEN 'NULL'
                                                      WHEN pg_catalog.length(v_given) <= 80 THEN pg_catalog.quote_literal(v_given)
                                                      ELSE pg_catalog.format('%s blanks and semicolons', pg_catalog.length(v_given)) END),
                      HINT = 'Pass one statement, e.g. ''SELECT now()''.';
        END IF;
        RAISE EXCEPTION 'request too large'
            USING ERRCODE = '54000', DETAIL = pg_catalog.format('The request has %s bytes.', pg_catalog.octet_length(v_given)),
                  HINT = 'A request is at most 1 MiB; call a function that holds the logic instead.';
    WHEN 'request, options' THEN
        RAISE EXCEPTION 'request too large'
            USING ERRCODE = '54000',
                  DETAIL = pg_catalog.format('The request has %s bytes; stored with its options it takes %s, over 1048576.',
                                             pg_catalog.octet_length(arguments ->> 'request'), arguments ->> 'stored'),
                  HINT = 'A request is at most 1 MiB with its options; call a function that holds the logic instead.';
    WHEN 'timeout' THEN
        RAISE EXCEPTION 'timeout must be positive'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('timeout is %s.', v_given),
                  HINT = 'Give the longest the statement may run, e.g. interval ''30 seconds'', or NULL for the stage''s lease_duration.';
    WHEN 'max' THEN
        RAISE EXCEPTION 'max must be at least 1'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('max is %s.', v_given),
                  HINT = 'Give how many tasks of the stage may run at once, or NULL to leave the stage''s cap as it is.';
    WHEN 'keep_history' THEN
        RAISE EXCEPTION 'keep_history must not be NULL'
            USING ERRCODE = '22004', DETAIL = pg_catalog.format('%s was called with keep_history NULL.', caller),
                  HINT = 'true keeps a history row of each successful run, false keeps none.';
    WHEN 'after' THEN
        IF pg_catalog.array_position(v_given::bigint[], NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'after must not contain NULL'
                USING ERRCODE = '22004', DETAIL = 'enqueue was called with a NULL id in after.',
                      HINT = 'Pass the ids of the tasks to wait for, e.g. as enqueue returned them.';
        END IF;
        RAISE EXCEPTION 'after out of range'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('after holds %s ids.', pg_catalog.cardinality(v_given::bigint[])),
                  HINT = 'A task waits for 1 to 1000 tasks (NULL: for none). For more, wait for a task that waits for part of them.';
    WHEN 'after_failed' THEN
        RAISE EXCEPTION 'unknown after_failed'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('after_failed is %s.', coalesce(pg_catalog.quote_literal(pg_catalog.left(v_given, 80)), 'NULL')),
                  HINT = 'Use ''cancel'' (cancel this task when one it waits for ends fatal or cancelled) or ''run'' (run it once they all ended).';
    WHEN 'repeat, mode' THEN
        RAISE EXCEPTION 'a task that waits cannot repeat or be re-run'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('enqueue was called with after and %s.',
                                             CASE WHEN arguments ->> 'repeat' IS NOT NULL THEN 'repeat' ELSE 'mode ''rerun''' END),
                  HINT = 'Leave repeat NULL and mode ''ignore''; to change a waiting task, cancel it and enqueue it again.';
    WHEN 'next_stage, repeat' THEN
        RAISE EXCEPTION 'a periodic task cannot move to another stage'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('Task %s repeats; finishing it re-arms it in its stage.', arguments ->> 'id'),
                  HINT = 'Finish it without next_stage and enqueue a new task in the next stage; cancel(id) ends the schedule.';
    WHEN 'sample_pages' THEN
        RAISE EXCEPTION 'sample_pages must be 1 or more'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('%s was called with sample_pages %s.', caller, coalesce(v_given, 'NULL')),
                  HINT = 'Leave it out for the default of 500 pages.';
    WHEN 'since' THEN
        RAISE EXCEPTION 'since must be an interval from 0 to 100 years'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('%s was called with since %s.', caller, coalesce(v_given, 'NULL')),
                  HINT = 'Leave it out for the last hour.';
    WHEN 'limits' THEN
        RAISE EXCEPTION 'stage % has concurrency limits', pg_catalog.quote_literal(arguments ->> 'stage')
            USING ERRCODE = '0A000',
                  DETAIL = 'max_running and group_limit count running tasks, rate_limit counts takes under the stage''s lock; '
                           || CASE caller WHEN 'consume' THEN 'consume records tasks as done without running them.'
                                          ELSE 'a task taken with take_locked stays ''ready''.' END,
                  HINT = 'Take from this stage with take_next, or lift its limits with configure_stage.';
    END CASE;
END
$$;
COMMENT ON FUNCTION queue._raise_bad_argument(text, text, jsonb) IS 'Internal: the slow path of every function''s argument check: raises the error of the argument its one guard found bad (docs/errors.md), or returns when a compressed payload turns out to fit.';
REVOKE ALL ON FUNCTION queue._raise_bad_argument(text, text, jsonb) FROM PUBLIC;
