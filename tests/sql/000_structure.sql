-- Structure of schema queue: the exact public API, how every function is declared, comments,
-- privileges, ownership, and a clean plpgsql_check. Catalog queries only; changes nothing.
-- Alembic's version table queue.skiplock_version exists only in a migrated database and belongs
-- to the migrating user, so the comment and ownership checks leave it out.
BEGIN;
SELECT plan(25);

-- The public API (functions not starting with '_'), with argument signatures: adding, removing or
-- changing the arguments of one must be a deliberate change of this list.
SELECT set_eq(
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace AND p.proname !~ '^_'$$,
    ARRAY[
        'queue.cancel(bigint,text)',
        'queue.cancel_overdue_sql_tasks()',
        'queue.compact()',
        'queue.configure_history(interval,integer,interval,text,interval)',
        'queue.configure_stage(text,interval,integer,text,interval,interval,real,boolean,integer,integer,boolean,integer,interval,integer,boolean,integer,interval,text)',
        'queue.consume(text,integer)',
        'queue.drain(text,integer)',
        'queue.consume(text[],integer)',
        'queue.distribute()',
        'queue.enqueue(jsonb,text,integer,timestamp with time zone,text,text,interval,boolean,text,bigint[],text)',
        'queue.enqueue_batch(jsonb[],text,integer,timestamp with time zone,text)',
        'queue.enqueue_sql(text,text,timestamp with time zone,interval,integer,text,text,interval,boolean,integer,boolean)',
        'queue.fail(bigint,uuid,text,boolean,interval,text)',
        'queue.fail_locked(bigint,text,boolean,interval,text,text)',
        'queue.finish(bigint,uuid,text,text,jsonb)',
        'queue.finish_and_take(bigint,uuid,text,integer,interval,text,jsonb)',
        'queue.finish_batch(bigint[],uuid[],text,jsonb[])',
        'queue.finish_locked(bigint,text,text,jsonb)',
        'queue.fire_schedules(timestamp with time zone)',
        'queue.grant_stage(text,regrole,boolean,boolean)',
        'queue.heartbeat(bigint,uuid,interval,text,jsonb)',
        'queue.maintain(timestamp with time zone)',
        'queue.maintain_now()',
        'queue.reap_hung()',
        'queue.record_results(text,bigint[],jsonb[])',
        'queue.release(bigint,uuid,interval,text)',
        'queue.retry(bigint,text)',
        'queue.revoke_stage(text,regrole)',
        'queue.rotate_partitions(timestamp with time zone)',
        'queue.run_schedule_now(text)',
        'queue.run_sql_tasks(text,integer,text,integer)',
        'queue.schedule(text,text,text,jsonb,integer,text,boolean)',
        'queue.set_priority(bigint,integer,text)',
        'queue.stop_sql_executor(integer)',
        'queue.take_locked(text,integer)',
        'queue.take_locked(text[],integer)',
        'queue.take_next(text,integer,interval,text)',
        'queue.take_next(text[],integer,interval,text)',
        'queue.task_timeout(text)',
        'queue.unschedule(text)',
        'queue.worker_settings(text)',
        'queue.live_counts(integer)',
        'queue.recent_errors(text,interval,integer)',
        'queue.workers()'
    ],
    'the public functions of schema queue are exactly the documented API, with these signatures'
);

SELECT is_empty(
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace AND p.proname !~ '^_' AND NOT p.prosecdef
         -- The SQL tasks' executor runs as its caller: a procedure that commits cannot be
         -- SECURITY DEFINER, and the watchdog signals the caller's own backends.
         AND p.oid NOT IN ('queue.run_sql_tasks(text,integer,text,integer)'::regprocedure,
                           'queue.cancel_overdue_sql_tasks()'::regprocedure,
                           'queue.stop_sql_executor(integer)'::regprocedure,
                           -- Citus reaches its nodes as the current user: a superuser's call.
                           'queue.distribute()'::regprocedure)$$,
    'every public function is SECURITY DEFINER but the SQL executor''s run_sql_tasks, cancel_overdue_sql_tasks and stop_sql_executor, and distribute (listed: others)'
);

-- The exact text stored in proconfig: a SECURITY DEFINER function must not resolve names through
-- the caller's search_path.
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text, p.proconfig::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace
         AND p.proconfig::text IS DISTINCT FROM '{"search_path=pg_catalog, pg_temp"}'
         -- The worker calls that find tasks by id, and the claims, keep one generic plan per
         -- statement (docs/decisions.md): the plan cache would plan them again on every call.
         AND NOT (p.oid IN ('queue.take_next(text,integer,interval,text)'::regprocedure,
                            'queue.take_locked(text,integer)'::regprocedure,
                            'queue.consume(text,integer)'::regprocedure,
                            'queue.drain(text,integer)'::regprocedure,
                            'queue.finish(bigint,uuid,text,text,jsonb)'::regprocedure,
                            'queue.fail(bigint,uuid,text,boolean,interval,text)'::regprocedure,
                            'queue.release(bigint,uuid,interval,text)'::regprocedure,
                            -- the stage lists: one plan for every batch size
                            'queue._history_stages()'::regprocedure,
                            'queue._live_stages()'::regprocedure)
                  AND p.proconfig::text = '{"search_path=pg_catalog, pg_temp",plan_cache_mode=force_generic_plan}')
         -- finish_batch joins its pairs to live_tasks, reap_hung its expired leases: the index,
         -- whatever the statistics.
         AND NOT (p.oid = 'queue.finish_batch(bigint[],uuid[],text,jsonb[])'::regprocedure
                  AND p.proconfig::text = '{"search_path=pg_catalog, pg_temp",plan_cache_mode=force_generic_plan,enable_seqscan=off}')
         AND NOT (p.oid = 'queue.reap_hung()'::regprocedure
                  AND p.proconfig::text = '{"search_path=pg_catalog, pg_temp",enable_seqscan=off}')
         AND NOT (p.oid IN ('queue.live_counts(integer)'::regprocedure, 'queue.recent_errors(text,interval,integer)'::regprocedure,
                            'queue.workers()'::regprocedure)
                  AND p.proconfig::text = '{"search_path=pg_catalog, pg_temp",enable_seqscan=off,max_parallel_workers_per_gather=0}')
         -- compact and rotate_partitions wait a bounded time for their locks: a queue of takes or
         -- finishes forms behind the wait.
         AND NOT (p.oid IN ('queue.compact()'::regprocedure, 'queue._roll_up_hours(timestamp with time zone)'::regprocedure)
                  AND p.proconfig::text = '{"search_path=pg_catalog, pg_temp",lock_timeout=100ms}')
         -- Partition bounds are written and read as text, in a DateStyle that round-trips.
         AND NOT (p.oid = 'queue.rotate_partitions(timestamptz)'::regprocedure
                  AND p.proconfig::text = '{"search_path=pg_catalog, pg_temp","DateStyle=ISO, YMD",lock_timeout=100ms}')
         AND NOT (p.oid = 'queue._history_partitions()'::regprocedure
                  AND p.proconfig::text = '{"search_path=pg_catalog, pg_temp","DateStyle=ISO, YMD"}')
         -- _held_entry and _history_row are expressions the planner inlines into their (pinned)
         -- callers; _settings, two probes, costs no more than the probes without a SET clause;
         -- _live_row_ok runs for every row a test writes (the CHECK the test suite adds).
         AND NOT (p.oid IN ('queue._held_entry(text,xid8,bigint)'::regprocedure,
                            'queue._history_row(queue.live_tasks,queue.task_status,integer,text,text,timestamptz,timestamptz,jsonb)'::regprocedure,
                            'queue._settings(text)'::regprocedure,
                            'queue._live_row_ok(queue.task_status_live,integer,uuid,timestamptz,timestamptz,boolean,interval,timestamptz,text,integer)'::regprocedure)
                  AND p.proconfig IS NULL)
         -- _mark_waiting never waits long: a take that finds its stage empty calls it.
         AND NOT (p.oid = 'queue._mark_waiting(text)'::regprocedure
                  AND p.proconfig::text = '{"search_path=pg_catalog, pg_temp",lock_timeout=10ms}')
         -- Time arithmetic in a fixed zone: _cron_next converts through TimeZone (a zone name is
         -- never read as an abbreviation), _next_slot adds days and months in UTC.
         AND NOT (p.oid IN ('queue._cron_next(text,timestamptz,text)'::regprocedure,
                            'queue._next_slot(timestamptz,interval,boolean,timestamptz)'::regprocedure)
                  AND p.proconfig::text = '{"search_path=pg_catalog, pg_temp",TimeZone=UTC}')
         -- A procedure with a SET clause cannot COMMIT; run_sql_tasks qualifies every name.
         AND p.oid <> 'queue.run_sql_tasks(text,integer,text,integer)'::regprocedure$$,
    'every function of queue (API and helpers) but the procedure run_sql_tasks has proconfig {"search_path=pg_catalog, pg_temp"} (take_next, take_locked, consume, drain, finish, fail, release, _history_stages and _live_stages add plan_cache_mode=force_generic_plan, finish_batch that and enable_seqscan=off, reap_hung enable_seqscan=off, live_counts, recent_errors and workers that and max_parallel_workers_per_gather=0, compact, _roll_up_hours and rotate_partitions lock_timeout=100ms, rotate_partitions and _history_partitions DateStyle=ISO, YMD, _mark_waiting lock_timeout=10ms, _cron_next and _next_slot TimeZone=UTC, _held_entry, _history_row, _settings and _live_row_ok none) (listed: those that do not)'
);

-- Comments: what \df+ and \d+ show a DBA.
SELECT isnt(pg_catalog.btrim(coalesce(pg_catalog.obj_description('queue'::regnamespace, 'pg_namespace'), '')), '',
            'schema queue has a comment');

SELECT is_empty(
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace
         AND pg_catalog.btrim(coalesce(pg_catalog.obj_description(p.oid, 'pg_proc'), '')) = ''$$,
    'every function of queue has a non-empty comment (listed: those without)'
);

SELECT is_empty(
    $$SELECT c.oid::regclass::text, c.relkind
        FROM pg_catalog.pg_class c
       WHERE c.relnamespace = 'queue'::regnamespace
         AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
         AND c.relname <> 'skiplock_version'
         AND pg_catalog.btrim(coalesce(pg_catalog.obj_description(c.oid, 'pg_class'), '')) = ''$$,
    'every table and view of queue has a non-empty comment (listed: those without)'
);

SELECT is_empty(
    $$SELECT c.oid::regclass::text || '.' || a.attname
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
       WHERE c.relnamespace = 'queue'::regnamespace
         AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
         AND NOT c.relispartition  -- a partition's columns are its parent's, described there
         AND c.relname <> 'skiplock_version'
         AND pg_catalog.btrim(coalesce(pg_catalog.col_description(c.oid, a.attnum), '')) = ''$$,
    'every column of the tables (partitions: their parent) and views of queue has a non-empty comment (listed: those without)'
);

-- Types declared on their own (enums, domains, ranges, standalone composites); the row and array
-- types that come with every table are described by the table.
SELECT is_empty(
    $$SELECT t.oid::regtype::text
        FROM pg_catalog.pg_type t
        LEFT JOIN pg_catalog.pg_class c ON c.oid = t.typrelid
       WHERE t.typnamespace = 'queue'::regnamespace
         AND t.typcategory <> 'A'
         AND (c.oid IS NULL OR c.relkind = 'c')
         AND pg_catalog.btrim(coalesce(pg_catalog.obj_description(t.oid, 'pg_type'), '')) = ''$$,
    'every type of queue has a non-empty comment (listed: those without)'
);

-- Nothing is granted to PUBLIC. A NULL proacl means the default ACL, which lets PUBLIC execute.
-- (Types keep PostgreSQL's default USAGE for PUBLIC: naming a type grants no access to data.)
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text, coalesce(p.proacl::text, 'NULL (default: EXECUTE to PUBLIC)')
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace
         AND (p.proacl IS NULL
              OR EXISTS (SELECT FROM pg_catalog.aclexplode(p.proacl) a WHERE a.grantee = 0))$$,
    'no function of queue is executable by PUBLIC: proacl is set and has no PUBLIC entry (listed: offenders)'
);

SELECT is_empty(
    $$SELECT c.oid::regclass::text, c.relacl::text
        FROM pg_catalog.pg_class c
       WHERE c.relnamespace = 'queue'::regnamespace
         AND EXISTS (SELECT FROM pg_catalog.aclexplode(c.relacl) a WHERE a.grantee = 0)$$,
    'no table, view or sequence of queue grants anything to PUBLIC (listed: offenders)'
);

SELECT is_empty(
    $$SELECT n.nspacl::text
        FROM pg_catalog.pg_namespace n
       WHERE n.nspname = 'queue'
         AND EXISTS (SELECT FROM pg_catalog.aclexplode(n.nspacl) a WHERE a.grantee = 0)$$,
    'schema queue grants nothing (no USAGE) to PUBLIC'
);

-- Role by role: helpers are for skiplock's own functions only.
SELECT is_empty(
    $$SELECT r.rolname, p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       CROSS JOIN pg_catalog.pg_roles r
       WHERE p.pronamespace = 'queue'::regnamespace AND p.proname ~ '^_'
         AND r.rolname IN ('skiplock_producer', 'skiplock_worker', 'skiplock_monitor', 'skiplock_admin')
         AND pg_catalog.has_function_privilege(r.oid, p.oid, 'EXECUTE')
         -- admins run their own SQL tasks too (member of skiplock_sql)
         AND NOT (r.rolname = 'skiplock_admin' AND p.proname ~ '^_sql_')
         -- the views metrics and stage_config call these, and a view's functions run with its reader's rights
         AND NOT (r.rolname IN ('skiplock_monitor', 'skiplock_admin') AND p.proname IN ('_hidden_stages', '_history_stages', '_live_stages'))$$,
    'no application role may execute a _ helper but admins the SQL executor''s _sql_*, and the readers of the views _hidden_stages, _history_stages and _live_stages (listed: role and helper)'
);

SELECT set_eq(
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace AND p.proname !~ '^_'
         AND pg_catalog.has_function_privilege('skiplock_producer', p.oid, 'EXECUTE')$$,
    ARRAY['queue.enqueue(jsonb,text,integer,timestamp with time zone,text,text,interval,boolean,text,bigint[],text)',
          'queue.enqueue_batch(jsonb[],text,integer,timestamp with time zone,text)'],
    'skiplock_producer may execute enqueue and enqueue_batch and nothing else'
);

SELECT set_eq(
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace AND p.proname !~ '^_'
         AND pg_catalog.has_function_privilege('skiplock_worker', p.oid, 'EXECUTE')$$,
    ARRAY['queue.take_next(text,integer,interval,text)',
          'queue.take_next(text[],integer,interval,text)',
          'queue.heartbeat(bigint,uuid,interval,text,jsonb)',
          'queue.finish(bigint,uuid,text,text,jsonb)',
          'queue.finish_batch(bigint[],uuid[],text,jsonb[])',
          'queue.fail(bigint,uuid,text,boolean,interval,text)',
          'queue.release(bigint,uuid,interval,text)',
          'queue.finish_and_take(bigint,uuid,text,integer,interval,text,jsonb)',
          'queue.take_locked(text,integer)',
          'queue.take_locked(text[],integer)',
          'queue.finish_locked(bigint,text,text,jsonb)',
          'queue.fail_locked(bigint,text,boolean,interval,text,text)',
          'queue.consume(text,integer)',
          'queue.consume(text[],integer)',
          'queue.drain(text,integer)',
          'queue.record_results(text,bigint[],jsonb[])',
          'queue.task_timeout(text)',
          'queue.worker_settings(text)',
          'queue.maintain_now()'],
    'skiplock_worker may execute take_next, heartbeat, finish, finish_batch, fail, release, finish_and_take, take_locked, finish_locked, fail_locked, consume, drain, record_results, task_timeout, worker_settings and maintain_now and nothing else'
);

SELECT is_empty(
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace
         AND pg_catalog.has_function_privilege('skiplock_monitor', p.oid, 'EXECUTE')
         AND p.proname NOT IN ('_hidden_stages', '_history_stages', '_live_stages')  -- what its views call
         AND p.proname NOT IN ('live_counts', 'recent_errors', 'workers')  -- the dashboard's bounded reads$$,
    'skiplock_monitor may execute no function of queue but the three its views call (_hidden_stages, _history_stages, _live_stages) and the dashboard''s live_counts, recent_errors and workers'
);

SELECT set_eq(
    $$SELECT c.oid::regclass::text
        FROM pg_catalog.pg_class c
       WHERE c.relnamespace = 'queue'::regnamespace
         AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
         AND pg_catalog.has_table_privilege('skiplock_monitor', c.oid, 'SELECT')$$,
    ARRAY['queue.tasks', 'queue.stats', 'queue.errors', 'queue.hourly', 'queue.metrics', 'queue.stage_config',
          'queue.finished_totals', 'queue.schedules', 'queue.rate_windows', 'queue.skiplock_version'],
    'skiplock_monitor may read exactly the views queue.tasks, queue.stats, queue.errors, queue.hourly, queue.metrics, queue.stage_config, queue.finished_totals and the tables queue.schedules, queue.rate_windows and Alembic''s queue.skiplock_version'
);

SELECT set_eq(
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace
         AND pg_catalog.has_function_privilege('skiplock_admin', p.oid, 'EXECUTE')$$,
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace
         AND (p.proname !~ '^_' OR p.proname ~ '^_sql_' OR p.proname IN ('_hidden_stages', '_history_stages', '_live_stages'))
         -- distribute() is the superuser's (Citus's own functions need a table's owner).
         AND p.proname <> 'distribute'$$,
    'skiplock_admin may execute every public function but distribute and no helper but the SQL executor''s (_sql_*, as a member of skiplock_sql) and the three its views call'
);

SELECT is_empty(
    $$SELECT r.rolname, c.oid::regclass::text, v.priv
        FROM pg_catalog.pg_class c
       CROSS JOIN pg_catalog.pg_roles r
       CROSS JOIN (VALUES ('SELECT'), ('INSERT'), ('UPDATE'), ('DELETE'), ('TRUNCATE')) AS v(priv)
       WHERE c.relnamespace = 'queue'::regnamespace
         AND c.relkind IN ('r', 'p')
         AND r.rolname IN ('skiplock_producer', 'skiplock_worker', 'skiplock_monitor', 'skiplock_admin')
         AND pg_catalog.has_table_privilege(r.oid, c.oid, v.priv)
         -- The exceptions: monitors and admins read the schedules and the rate windows (no task data);
         -- every role reads Alembic's version table (one revision id: the CLI warns a login whose
         -- database is behind).
         AND NOT (c.oid IN ('queue.schedules'::regclass, 'queue.rate_windows'::regclass) AND v.priv = 'SELECT'
                  AND r.rolname IN ('skiplock_monitor', 'skiplock_admin'))
         AND NOT (c.relname = 'skiplock_version' AND v.priv = 'SELECT')$$,
    'no application role may write a table of queue, nor read one but queue.schedules, queue.rate_windows and queue.skiplock_version (listed: role, table, privilege)'
);

-- The privilege check in action: a worker reading the hot table is refused.
SET LOCAL ROLE skiplock_worker;
SELECT throws_ok(
    'SELECT pg_catalog.count(*) FROM queue.live_tasks',
    '42501', 'permission denied for table live_tasks',
    'a worker selecting from queue.live_tasks directly gets 42501'
);
RESET ROLE;

-- Ownership: SECURITY DEFINER functions run as their owner, so everything belongs to skiplock_owner.
SELECT is(pg_catalog.pg_get_userbyid(n.nspowner)::text, 'skiplock_owner', 'schema queue is owned by skiplock_owner')
  FROM pg_catalog.pg_namespace n
 WHERE n.nspname = 'queue';

SELECT is_empty(
    $$SELECT p.oid::regprocedure::text, pg_catalog.pg_get_userbyid(p.proowner)
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace
         AND p.proowner <> 'skiplock_owner'::regrole$$,
    'every function of queue is owned by skiplock_owner (listed: others and their owner)'
);

SELECT is_empty(
    $$SELECT c.oid::regclass::text, c.relkind, pg_catalog.pg_get_userbyid(c.relowner)
        FROM pg_catalog.pg_class c
       WHERE c.relnamespace = 'queue'::regnamespace
         AND c.relowner <> 'skiplock_owner'::regrole
         AND c.relname NOT IN ('skiplock_version', 'skiplock_version_pkc')$$,
    'every table, view, index and sequence of queue is owned by skiplock_owner (listed: others and their owner)'
);

SELECT is_empty(
    $$SELECT t.oid::regtype::text, pg_catalog.pg_get_userbyid(t.typowner)
        FROM pg_catalog.pg_type t
       WHERE t.typnamespace = 'queue'::regnamespace
         AND t.typowner <> 'skiplock_owner'::regrole
         AND t.typname NOT IN ('skiplock_version', '_skiplock_version')$$,
    'every type of queue is owned by skiplock_owner (listed: others and their owner)'
);

-- plpgsql_check over every PL/pgSQL function, with extra and performance warnings. No level is
-- excluded: there are no findings, and a new one must be fixed (or justified here) before it lands.
SELECT cmp_ok(
    (SELECT pg_catalog.count(*)::integer
       FROM pg_catalog.pg_proc p
       JOIN pg_catalog.pg_language l ON l.oid = p.prolang
      WHERE p.pronamespace = 'queue'::regnamespace AND l.lanname = 'plpgsql'),
    '>=', 10,
    'plpgsql_check below has the PL/pgSQL functions of queue to check'
);

-- plpgsql_check is built for the machine's own major only (`make test` installs it there and fails
-- without it); on the other majors `make test` runs, this one check is skipped.
SELECT CASE WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'plpgsql_check')
            THEN skip('plpgsql_check is not installed for PostgreSQL ' || pg_catalog.current_setting('server_version'), 1)
            ELSE is_empty(
    $$SELECT p.oid::regprocedure::text, r.level, r.lineno, r.sqlstate, r.message, r.detail, r.hint, r.query
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_language l ON l.oid = p.prolang
       CROSS JOIN LATERAL plpgsql_check_function_tb(p.oid, fatal_errors => false,
                                                    extra_warnings => true,
                                                    performance_warnings => true) r
       WHERE p.pronamespace = 'queue'::regnamespace AND l.lanname = 'plpgsql'$$,
    'plpgsql_check finds nothing in any PL/pgSQL function of queue (listed: every finding)'
) END;

SELECT * FROM finish();
ROLLBACK;
