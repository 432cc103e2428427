-- The monitoring views: queue.stats, queue.tasks, queue.errors, queue.hourly, and what role
-- skiplock_monitor may read.
BEGIN;
SELECT plan(19);
-- queue.hourly's hours are the session's: in UTC no hour repeats at a change of daylight saving time.
SET LOCAL TimeZone = 'UTC';

CREATE FUNCTION pg_temp.plan_lines(query text, options text DEFAULT '') RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_line text;
BEGIN
    FOR v_line IN EXECUTE 'EXPLAIN (' || options || 'COSTS OFF) ' || query LOOP
        RETURN NEXT v_line;
    END LOOP;
END
$$;

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);

-- Stage vw.s holds one group of every status:
-- done (2), fatal (1), cancelled (1), running (2, one lease expired), error (1, due), ready (2, one due).
INSERT INTO made VALUES ('d1', queue.enqueue('{"n": 1}', 'vw.s'));
INSERT INTO made VALUES ('d2', queue.enqueue('{"n": 2}', 'vw.s'));
INSERT INTO made VALUES ('f1', queue.enqueue('{"n": 3}', 'vw.s'));
INSERT INTO made VALUES ('c1', queue.enqueue('{"n": 4}', 'vw.s'));
INSERT INTO took SELECT m.name, k.* FROM queue.take_next('vw.s', batch => 3, worker => 'w-s') k JOIN made m ON m.id = k.id;
SELECT is(queue.finish_batch(array_agg(id), array_agg(lease)), 2, 'two tasks of vw.s are done')
  FROM took WHERE name IN ('d1', 'd2');
SELECT is(queue.fail(id, lease, 'bad', fatal => true), true, 'one task of vw.s is fatal') FROM took WHERE name = 'f1';
SELECT lives_ok(format('SELECT queue.cancel(%s)', id), 'one task of vw.s is cancelled') FROM made WHERE name = 'c1';
INSERT INTO made VALUES ('t1', queue.enqueue('{"n": 5}', 'vw.s'));
INSERT INTO made VALUES ('t2', queue.enqueue('{"n": 6}', 'vw.s'));
INSERT INTO took SELECT m.name, k.* FROM queue.take_next('vw.s', batch => 2) k JOIN made m ON m.id = k.id;
INSERT INTO made VALUES ('e1', queue.enqueue('{"n": 7}', 'vw.s'));
INSERT INTO took SELECT 'e1', k.* FROM queue.take_next('vw.s') k;
SELECT is(queue.fail(id, lease, 'flaky', retry_in => interval '0'), true, 'one task of vw.s waits for a due retry')
  FROM took WHERE name = 'e1';
INSERT INTO made VALUES ('r1', queue.enqueue('{"n": 8}', 'vw.s'));
INSERT INTO made VALUES ('r2', queue.enqueue('{"n": 9}', 'vw.s', priority => 2, run_at => now() + interval '1 hour', key => 'r-2'));
-- now() does not move in this transaction: as superuser, let one lease run out and age some tasks.
UPDATE queue.live_tasks SET lease_expires = now() - interval '1 second' WHERE id = (SELECT id FROM made WHERE name = 't1');
UPDATE queue.live_tasks SET created = now() - interval '2 hours' WHERE id = (SELECT id FROM made WHERE name = 'r1');
UPDATE queue.history SET created = now() - interval '3 hours' WHERE id = (SELECT id FROM made WHERE name = 'd1');

SELECT results_eq(
    $$SELECT status, tasks, due, oldest_age, next_run_at, lease_expired FROM queue.stats WHERE stage = 'vw.s' ORDER BY status$$,
    $$VALUES ('ready'::queue.task_status, 2::bigint, 1::bigint, interval '2 hours', now(),             0::bigint),
             ('running',                    2,         0,         interval '0',       now(),             1),
             ('error',                      1,         1,         interval '0',       now(),             0),
             ('done',                       2,         0,         interval '3 hours', NULL::timestamptz, 0),
             ('fatal',                      1,         0,         interval '0',       NULL,              0),
             ('cancelled',                  1,         0,         interval '0',       NULL,              0)$$,
    'queue.stats counts each status of a stage: tasks, due, oldest age, next run, expired leases; final statuses from history');

-- queue.tasks: every documented column, for a live and a finished task.
SELECT results_eq(
    $$SELECT id, stage, status::text, priority, payload, key, attempt, run_at, error_text, created, started, finished
        FROM queue.tasks WHERE id = (SELECT id FROM made WHERE name = 'r2')$$,
    $$SELECT id, 'vw.s', 'ready', 2, '{"n": 9}'::jsonb, 'r-2', 0, now() + interval '1 hour', NULL::text, now(),
             NULL::timestamptz, NULL::timestamptz
        FROM made WHERE name = 'r2'$$,
    'queue.tasks shows a live task with every documented column; finished is NULL');
SELECT results_eq(
    $$SELECT id, stage, status::text, priority, payload, key, attempt, run_at, error_text, created, started, finished
        FROM queue.tasks WHERE id = (SELECT id FROM made WHERE name = 'f1')$$,
    $$SELECT id, 'vw.s', 'fatal', 0, '{"n": 3}'::jsonb, NULL::text, 1, now(), 'bad', now(), now(), now()
        FROM made WHERE name = 'f1'$$,
    'queue.tasks shows a finished task with every documented column');
SELECT results_eq(
    $$SELECT status, count(*) FROM queue.tasks WHERE stage = 'vw.s' GROUP BY status ORDER BY status$$,
    $$VALUES ('ready'::queue.task_status, 2::bigint), ('running', 2), ('error', 1), ('done', 2), ('fatal', 1), ('cancelled', 1)$$,
    'queue.tasks holds every task of the stage, live and finished');

-- queue.errors, stage vw.e: 'timeout' twice live and once fatal, 'bad input' once live; a task
-- that timed out once and then succeeded is done and not counted.
INSERT INTO made SELECT 've' || n, id FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[5]), 'vw.e') WITH ORDINALITY AS e(id, n);
INSERT INTO took SELECT m.name, k.* FROM queue.take_next('vw.e', batch => 5) k JOIN made m ON m.id = k.id;
SELECT is((SELECT count(*)::integer FROM took t
            WHERE (t.name IN ('ve1', 've2') AND queue.fail(t.id, t.lease, 'timeout'))
               OR (t.name = 've3' AND queue.fail(t.id, t.lease, 'timeout', fatal => true))
               OR (t.name = 've4' AND queue.fail(t.id, t.lease, 'bad input'))
               OR (t.name = 've5' AND queue.fail(t.id, t.lease, 'timeout', retry_in => interval '0'))), 5,
          'five tasks of vw.e fail');
INSERT INTO took SELECT 've5-again', k.* FROM queue.take_next('vw.e') k;
SELECT is(queue.finish(id, lease), true, 'the task that failed once then succeeds') FROM took WHERE name = 've5-again';
-- As superuser: spread the failure times so that last_seen has to pick the latest of both tables.
UPDATE queue.live_tasks SET updated = now() - interval '2 hours' WHERE id = (SELECT id FROM made WHERE name = 've1');
UPDATE queue.live_tasks SET updated = now() - interval '30 minutes' WHERE id = (SELECT id FROM made WHERE name = 've2');
UPDATE queue.history SET finished = now() - interval '1 hour' WHERE id = (SELECT id FROM made WHERE name = 've3');
SELECT results_eq(
    $$SELECT error, tasks, last_seen FROM queue.errors WHERE stage = 'vw.e' ORDER BY error$$,
    $$VALUES ('bad input', 1::bigint, now()), ('timeout', 3, now() - interval '30 minutes')$$,
    'queue.errors groups live error and fatal tasks by stage and error text, with count and last failure');

-- queue.hourly, stage vw.h: history rows inserted directly, with known start and finish times.
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished)
SELECT -r.n, 'vw.h', r.status::queue.task_status, 0, h.h, '{}', 1, h.h, h.h + r.started, h.h + r.finished
  FROM (SELECT date_trunc('hour', now()) - interval '2 hours' AS h) h,
       (VALUES (1, 'done',      interval '10 minutes', interval '11 minutes'),             -- 60 s
               (2, 'done',      interval '20 minutes', interval '23 minutes'),             -- 180 s
               (3, 'fatal',     interval '30 minutes', interval '30 minutes 30 seconds'),  -- 30 s
               (4, 'cancelled', NULL,                  interval '40 minutes'),             -- never ran
               (5, 'done',      interval '65 minutes', interval '65 minutes 10 seconds')   -- 10 s, next hour
       ) AS r(n, status, started, finished);
SELECT results_eq(
    $$SELECT hour, finished, done, fatal, cancelled, total_run_time, avg_run_time FROM queue.hourly WHERE stage = 'vw.h' ORDER BY hour$$,
    $$VALUES (date_trunc('hour', now()) - interval '2 hours', 4::bigint, 2::bigint, 1::bigint, 1::bigint,
              interval '270 seconds', interval '90 seconds'),
             (date_trunc('hour', now()) - interval '1 hour', 1, 1, 0, 0, interval '10 seconds', interval '10 seconds')$$,
    'queue.hourly counts finished runs by status and sums and averages their run time per stage and hour');

-- queue.hourly reads only the partitions of its last 7 days: an old partition is pruned (when the
-- query runs: the bound comes from the rollup's clock, so EXPLAIN ANALYZE shows it never executed).
SELECT count(*) FROM queue.rotate_partitions(now() - interval '20 days');
SELECT ok(NOT EXISTS (SELECT 1 FROM pg_temp.plan_lines($$SELECT * FROM queue.hourly$$, 'ANALYZE, TIMING OFF, SUMMARY OFF, ') l
                       WHERE l ~ pg_catalog.format('on history_%s', pg_catalog.to_char(now() AT TIME ZONE 'UTC' - interval '20 days', 'YYYYMMDD'))
                         AND l !~ 'never executed'),
          'queue.hourly skips history partitions older than 7 days (partition pruning)');

-- What skiplock_monitor may read.
SET LOCAL ROLE skiplock_monitor;
SELECT is((SELECT count(*)::integer FROM queue.tasks WHERE stage = 'vw.s'), 9, 'skiplock_monitor can SELECT queue.tasks');
SELECT is((SELECT sum(tasks)::integer FROM queue.stats WHERE stage = 'vw.s'), 9, 'skiplock_monitor can SELECT queue.stats');
SELECT is((SELECT sum(tasks)::integer FROM queue.errors WHERE stage = 'vw.e'), 4, 'skiplock_monitor can SELECT queue.errors');
SELECT is((SELECT sum(finished)::integer FROM queue.hourly WHERE stage = 'vw.h'), 5, 'skiplock_monitor can SELECT queue.hourly');
SELECT throws_ok('SELECT * FROM queue.live_tasks', '42501', 'permission denied for table live_tasks',
                 'skiplock_monitor cannot SELECT queue.live_tasks');
SELECT throws_ok('SELECT * FROM queue.history', '42501', 'permission denied for table history',
                 'skiplock_monitor cannot SELECT queue.history');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
