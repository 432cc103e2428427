-- queue.rotate_partitions: with an injected now it creates exactly the partitions of the current
-- period and premake periods after it, drops (or detaches) those whose whole range is past the
-- retention, leaves ranges that have rows in the default partition alone, truncates the default
-- partition only when all its rows are past the retention; finished tasks land in their dated
-- partition and a query on a finish-time range reads only the matching partitions.
-- What needs a second session (a busy lock skipped at once, a concurrent rotation, finishes in
-- flight) is in tests/py/test_rotation_under_load.py.
BEGIN;
SELECT plan(63);

-- Start each scenario from history with only its default partition, and the default policy.
CREATE FUNCTION pg_temp.reset() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v record;
BEGIN
    FOR v IN SELECT h.schema, h.name FROM queue._history_partitions() h LOOP
        EXECUTE format('DROP TABLE %I.%I', v.schema, v.name);
    END LOOP;
    TRUNCATE queue.history_default;
    UPDATE queue.history_policy
       SET partition_interval = '1 day', premake = 7, retention = '30 days', retention_action = 'drop',
           rotate_every = '10 minutes', last_rotated = NULL;
END
$$;
-- The tables a plan reads (partitions and the default), from EXPLAIN.
CREATE FUNCTION pg_temp.tables_read(query text) RETURNS text[] LANGUAGE sql AS $$
    SELECT ARRAY(SELECT DISTINCT m[1] FROM regexp_matches(public.plan_text(query, '(COSTS OFF)'), ' on (history_[a-z0-9]+)', 'g') AS m
                  ORDER BY 1);
$$;
CREATE TEMP VIEW parts AS
SELECT h.name, lower(h.range) AS lo, upper(h.range) AS hi FROM queue._history_partitions() h;

SELECT pg_temp.reset();

-- Real now: the partitions of today and the 7 days after; a finished task lands in today's ---------------
CREATE TEMP TABLE r AS SELECT * FROM queue.rotate_partitions();
SELECT set_eq(
    $$SELECT partition FROM r WHERE action = 'created'$$,
    $$SELECT format('queue.history_%s', to_char(d, 'YYYYMMDD'))
        FROM generate_series(date_trunc('day', now() AT TIME ZONE 'UTC'),
                             date_trunc('day', now() AT TIME ZONE 'UTC') + interval '7 days', interval '1 day') d$$,
    'rotate_partitions() creates the partitions of today (UTC) and the 7 days after it, and nothing else');
SELECT is((SELECT count(*)::integer FROM r), 8, 'it returns a row per partition created');
SELECT ok((SELECT detail LIKE '%(ACCESS EXCLUSIVE lock on queue.history)' FROM r
            WHERE partition = format('queue.history_%s', to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD'))),
          'the partition of the current period is attached under ACCESS EXCLUSIVE on queue.history (a finish in flight could route a row into it)');
SELECT ok((SELECT detail LIKE '%(SHARE UPDATE EXCLUSIVE lock on queue.history)' FROM r
            WHERE partition = format('queue.history_%s', to_char(now() AT TIME ZONE 'UTC' + interval '2 days', 'YYYYMMDD'))),
          'a partition starting more than an hour ahead is attached under SHARE UPDATE EXCLUSIVE, which finishes do not wait for');

CREATE TEMP TABLE task AS SELECT queue.enqueue('{"n": 1}', 'rp.s') AS id;
SELECT ok(queue.finish(k.id, k.lease), 'setup: a task is taken and finished') FROM queue.take_next('rp.s') k;
SELECT is((SELECT h.tableoid::regclass::text FROM queue.history h WHERE h.id = (SELECT id FROM task)),
          format('queue.history_%s', to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')),
          'a finished task is stored in today''s partition, not the default');

-- Injected now: exactly the right partitions; the old ones go -------------------------------------------
CREATE TEMP TABLE before AS SELECT name FROM parts;
CREATE TEMP TABLE r2 AS SELECT * FROM queue.rotate_partitions('2430-06-15 12:00+00');
SELECT results_eq(
    $$SELECT partition FROM r2 WHERE action = 'created' ORDER BY partition$$,
    $$SELECT format('queue.history_%s', d) FROM unnest(ARRAY['24300615', '24300616', '24300617', '24300618',
                                                              '24300619', '24300620', '24300621', '24300622']) d$$,
    'with now 2430-06-15 12:00 it creates history_24300615 to history_24300622 (the current day and 7 ahead)');
SELECT set_eq($$SELECT partition FROM r2 WHERE action = 'dropped'$$, $$SELECT 'queue.' || name FROM before$$,
              'every partition whose range ended before now - 30 days is dropped');
SELECT is((SELECT count(*)::integer FROM r2 WHERE action NOT IN ('created', 'dropped')), 0, 'and nothing else is done');
SELECT set_eq($$SELECT name FROM parts$$,
              $$SELECT 'history_' || to_char(d, 'YYYYMMDD') FROM generate_series(timestamp '2430-06-15', '2430-06-22', '1 day') d$$,
              'queue.history then has exactly those 8 dated partitions');
SELECT results_eq($$SELECT lo, hi FROM parts WHERE name = 'history_24300615'$$,
                  $$VALUES ('2430-06-15 00:00+00'::timestamptz, '2430-06-16 00:00+00'::timestamptz)$$,
                  'history_24300615 covers finish times from 2430-06-15 00:00 UTC up to, not including, the next midnight');
SELECT is((SELECT count(*)::integer FROM queue.history h WHERE h.id = (SELECT id FROM task)), 0,
          'the task finished today went with its partition (dropped, never deleted row by row)');
SELECT is((SELECT p.last_rotated FROM queue.history_policy p), '2430-06-15 12:00+00'::timestamptz,
          'rotate_partitions records its now in history_policy.last_rotated');
SELECT is_empty(
    $$SELECT c.relname FROM pg_class c JOIN parts p ON p.name = c.relname AND c.relnamespace = 'queue'::regnamespace
       WHERE c.relowner <> 'skiplock_owner'::regrole OR c.relacl IS NOT NULL
          OR coalesce(obj_description(c.oid, 'pg_class'), '') NOT LIKE 'Finished tasks of % UTC: a partition of queue.history%'$$,
    'every partition it makes is owned by skiplock_owner, grants nothing to anyone, and has a comment (listed: offenders)');
SELECT is_empty(
    $$SELECT p.name FROM parts p
       WHERE (SELECT count(*) FROM pg_index i JOIN pg_inherits x ON x.inhrelid = i.indexrelid
               WHERE i.indrelid = ('queue.' || p.name)::regclass)
             <> (SELECT count(*) FROM pg_index i WHERE i.indrelid = 'queue.history'::regclass)
          OR EXISTS (SELECT FROM pg_constraint k WHERE k.conrelid = ('queue.' || p.name)::regclass AND k.contype = 'c')$$,
    'every partition it makes has every index of queue.history attached and, as queue.history, no CHECK');
SELECT is_empty($$SELECT * FROM queue.rotate_partitions('2430-06-15 12:00+00')$$,
                'a second rotation at the same now has nothing to do and returns no row');
SELECT results_eq($$SELECT action, partition FROM queue.rotate_partitions('2430-06-16 00:00+00')$$,
                  $$VALUES ('created', 'queue.history_24300623')$$,
                  'a day later it creates the one new day ahead, and drops nothing');

-- Retention: a partition goes when its whole range is older than now - retention -----------------------
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, finished)
VALUES (-1, 'rp.old', 'done', 0, '2430-06-16 23:59:59+00', '{}', 1, '2430-06-16 23:59:59+00', '2430-06-16 23:59:59+00'),
       (-2, 'rp.old', 'done', 0, '2430-06-17 00:00:00+00', '{}', 1, '2430-06-17 00:00:00+00', '2430-06-17 00:00:00+00');
SELECT results_eq($$SELECT partition FROM queue.rotate_partitions('2430-07-17 00:00+00') WHERE action = 'dropped' ORDER BY 1$$,
                  $$VALUES ('queue.history_24300615'), ('queue.history_24300616')$$,
                  'with now 2430-07-17 00:00 (cutoff 2430-06-17 00:00) it drops exactly the partitions ending at or before the cutoff');
SELECT results_eq($$SELECT id FROM queue.history WHERE stage = 'rp.old'$$, $$VALUES (-2::bigint)$$,
                  'a row finished one second before the cutoff went with its partition; one finished at the cutoff stays');
SELECT is_empty($$SELECT * FROM queue.rotate_partitions('2430-07-17 23:59:59+00') WHERE action = 'dropped'$$,
                'a partition whose range reaches past the cutoff is kept, even a second before its end passes it');

-- retention_action 'detach': the partition leaves queue.history but keeps its rows ------------------------
SELECT lives_ok($$SELECT queue.configure_history(retention_action => 'detach')$$, 'setup: retention_action detach');
SELECT results_eq($$SELECT action, partition FROM queue.rotate_partitions('2430-07-18 00:00+00') WHERE action <> 'created'$$,
                  $$VALUES ('detached', 'queue.history_24300617')$$,
                  'with retention_action detach the partition past the retention is detached, not dropped');
SELECT results_eq(
    $$SELECT c.relispartition, c.relkind::text, (SELECT count(*)::integer FROM queue.history_24300617)
        FROM pg_class c WHERE c.oid = 'queue.history_24300617'::regclass$$,
    $$VALUES (false, 'r', 1)$$,
    'the detached partition is a plain table that still holds its rows');
SELECT is_empty($$SELECT * FROM queue.history WHERE stage = 'rp.old'$$, 'its rows are no longer in queue.history');
SELECT ok(obj_description('queue.history_24300617'::regclass, 'pg_class') LIKE 'Finished tasks of 2430-06-17 00:00 to 2430-06-18 00:00 UTC, detached from queue.history%',
          'the detached table''s comment says what it holds and that it was detached');
SELECT lives_ok($$SELECT queue.configure_history(retention_action => 'drop')$$, 'setup: retention_action drop again');

-- Rows of a range already in the default partition: no partition for it, the rows stay ----------------
SELECT pg_temp.reset();
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, finished)
VALUES (-3, 'rp.def', 'done', 0, '2430-09-03 05:00+00', '{}', 1, '2430-09-03 05:00+00', '2430-09-03 05:00+00');
SELECT is((SELECT tableoid::regclass::text FROM queue.history WHERE id = -3), 'queue.history_default',
          'a row no dated partition covers goes to the default partition (finishing never fails for want of a partition)');
CREATE TEMP TABLE r3 AS SELECT * FROM queue.rotate_partitions('2430-09-01 12:00+00');
SELECT results_eq(
    $$SELECT action, partition FROM r3 WHERE action <> 'kept' ORDER BY partition$$,
    $$VALUES ('created', 'queue.history_24300901'), ('created', 'queue.history_24300902'),
             ('skipped: rows in default', 'queue.history_24300903'),
             ('created', 'queue.history_24300904'), ('created', 'queue.history_24300905'),
             ('created', 'queue.history_24300906'), ('created', 'queue.history_24300907'),
             ('created', 'queue.history_24300908')$$,
    'the day whose rows sit in the default partition is skipped and reported; the others are created');
SELECT ok((SELECT detail LIKE 'queue.history_default holds rows finished from 2430-09-03 00:00 to 2430-09-04 00:00 UTC%'
             FROM r3 WHERE action = 'skipped: rows in default'),
          'the skip says why: the default partition holds rows of that range');
SELECT is((SELECT tableoid::regclass::text FROM queue.history WHERE id = -3), 'queue.history_default',
          'the rows stay in the default partition');
SELECT results_eq(
    $$SELECT action, partition, detail LIKE '1 rows finished from 2430-09-03 05:00:00 to 2430-09-03 05:00:00 UTC; the newest is within the retention%'
        FROM r3 WHERE action = 'kept'$$,
    $$VALUES ('kept', 'queue.history_default', true)$$,
    'rows of the default partition within the retention are kept, and reported');

-- A range query reads only the matching partitions ----------------------------------------------------------
SELECT is(pg_temp.tables_read($$SELECT count(*) FROM queue.history h
                                 WHERE h.finished >= '2430-09-02 01:00+00' AND h.finished < '2430-09-02 02:00+00'$$),
          ARRAY['history_24300902'],
          'a query on an hour of finish times reads only that day''s partition (partition pruning)');
SELECT is(pg_temp.tables_read($$SELECT count(*) FROM queue.history h
                                 WHERE h.finished >= '2430-09-04 12:00+00' AND h.finished < '2430-09-06 00:00+00'$$),
          ARRAY['history_24300904', 'history_24300905'],
          'a query across two days reads only those two partitions');
SELECT is(pg_temp.tables_read($$SELECT count(*) FROM queue.history h WHERE h.stage = 'rp.def'
                                 AND h.finished >= '2430-09-03 00:00+00' AND h.finished < '2430-09-03 06:00+00'$$),
          ARRAY['history_default'],
          'a range no dated partition covers reads only the default partition');
-- (queue.hourly covers the last 7 days and prunes older partitions: tests/sql/090_views.sql.)

-- The default partition is emptied only whole, by TRUNCATE, once every row is past the retention ---------
SELECT results_eq(
    $$SELECT action, partition FROM queue.rotate_partitions('2430-10-03 06:00+00') WHERE partition = 'queue.history_default'$$,
    $$VALUES ('truncated', 'queue.history_default')$$,
    'with every row of the default partition older than now - retention, it truncates the default partition');
SELECT is((SELECT count(*)::integer FROM queue.history_default), 0, 'the default partition is then empty');

-- Other intervals: an hour, a week; a change of interval fills only what is not covered ---------------------
SELECT pg_temp.reset();
SELECT lives_ok($$SELECT queue.configure_history(partition_interval => '1 hour', premake => 3, retention => '1 day')$$,
                'setup: hourly partitions, 3 ahead');
SELECT results_eq($$SELECT partition FROM queue.rotate_partitions('2431-01-01 10:30+00') ORDER BY 1$$,
                  $$VALUES ('queue.history_2431010110'), ('queue.history_2431010111'), ('queue.history_2431010112'), ('queue.history_2431010113')$$,
                  'hourly: the current hour and 3 ahead, named from their start (yyyymmddhh)');
SELECT results_eq($$SELECT lo, hi FROM parts WHERE name = 'history_2431010110'$$,
                  $$VALUES ('2431-01-01 10:00+00'::timestamptz, '2431-01-01 11:00+00'::timestamptz)$$,
                  'an hourly partition covers exactly its hour');

SELECT pg_temp.reset();
SELECT lives_ok($$SELECT queue.configure_history(partition_interval => '1 week', premake => 1, retention => '7 days')$$,
                'setup: weekly partitions, 1 ahead');
SELECT results_eq($$SELECT partition FROM queue.rotate_partitions('2431-03-05 12:00+00') ORDER BY 1$$,
                  $$VALUES ('queue.history_24310303'), ('queue.history_24310310')$$,
                  'weekly: the week from Monday 00:00 UTC (2431-03-03) and the next one');

SELECT pg_temp.reset();
SELECT lives_ok($$SELECT queue.configure_history(premake => 2)$$, 'setup: daily partitions, 2 ahead');
SELECT lives_ok($$SELECT * FROM queue.rotate_partitions('2431-05-07 12:00+00')$$, 'setup: days 2431-05-07 to 05-09 exist');
SELECT lives_ok($$SELECT queue.configure_history(partition_interval => '7 days', premake => 1)$$, 'setup: switch to weeks');
SELECT lives_ok($$SELECT * FROM queue.rotate_partitions('2431-05-07 12:00+00')$$, 'setup: rotate with weeks');
SELECT results_eq(
    $$SELECT name, lo, hi FROM parts ORDER BY lo$$,
    $$VALUES ('history_24310505', '2431-05-05 00:00+00'::timestamptz, '2431-05-07 00:00+00'::timestamptz),
             ('history_24310507', '2431-05-07 00:00+00', '2431-05-08 00:00+00'),
             ('history_24310508', '2431-05-08 00:00+00', '2431-05-09 00:00+00'),
             ('history_24310509', '2431-05-09 00:00+00', '2431-05-10 00:00+00'),
             ('history_24310510', '2431-05-10 00:00+00', '2431-05-12 00:00+00'),
             ('history_24310512', '2431-05-12 00:00+00', '2431-05-19 00:00+00')$$,
    'after a change from days to weeks, the weeks are created around the existing days: no gap, no overlap');

-- Partitions are UTC periods whatever the session's TimeZone (DST never makes a 23- or 25-hour day) -------
SELECT pg_temp.reset();
SET LOCAL TimeZone = 'America/New_York';
SELECT lives_ok($$SELECT * FROM queue.rotate_partitions('2432-03-10 03:00+00')$$,
                'setup: rotation in a session on New York time, across the 2432-03-14 DST change');
SELECT results_eq(
    $$SELECT count(*)::integer, min(lo), bool_and(hi - lo = interval '24 hours') FROM parts$$,
    $$VALUES (8, '2432-03-10 00:00+00'::timestamptz, true)$$,
    'the days start at 00:00 UTC and last 24 hours each, whatever the session TimeZone');
RESET TimeZone;

-- ... and whatever its DateStyle: the bounds go into DDL as text, and a zone abbreviation (SQL,
-- Postgres and German styles print one) may read back as another zone (IST as Israel's) or not at all.
SELECT pg_temp.reset();
SET LOCAL DateStyle = 'SQL, MDY';
SET LOCAL TimeZone = 'Asia/Kolkata';
SELECT lives_ok($$SELECT * FROM queue.rotate_partitions('2432-03-10 03:00+00')$$,
                'setup: rotation in a session with DateStyle SQL on Kolkata time (IST)');
RESET DateStyle;
RESET TimeZone;
SELECT results_eq(
    $$SELECT count(*)::integer, min(lo), bool_and(hi - lo = interval '24 hours') FROM parts$$,
    $$VALUES (8, '2432-03-10 00:00+00'::timestamptz, true)$$,
    'the days start at 00:00 UTC and last 24 hours each with DateStyle SQL on Kolkata time');
SELECT pg_temp.reset();
SET LOCAL DateStyle = 'Postgres, DMY';
SET LOCAL TimeZone = 'Asia/Jakarta';
SELECT lives_ok($$SELECT * FROM queue.rotate_partitions('2432-03-10 03:00+00')$$,
                'rotation with DateStyle Postgres on Jakarta time (WIB, an abbreviation PostgreSQL does not know) works');
RESET DateStyle;
RESET TimeZone;

-- Under retention_action detach, the default partition's expired rows are kept in a plain table ----------
SELECT pg_temp.reset();
SELECT lives_ok($$SELECT queue.configure_history(retention_action => 'detach')$$, 'setup: retention_action detach');
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, finished)
VALUES (-4, 'rp.keep', 'done', 0, '2433-01-03 05:00+00', '{}', 1, '2433-01-03 05:00+00', '2433-01-03 05:00+00');
CREATE TEMP TABLE r4 AS SELECT * FROM queue.rotate_partitions('2433-03-01 12:00+00') WHERE partition LIKE 'queue.history_default%';
SELECT results_eq($$SELECT action, partition LIKE 'queue.history\_default\_%' FROM r4$$,
                  $$VALUES ('detached', true)$$,
                  'with retention_action detach, the default''s expired rows are reported detached into a table of their own');
SELECT is((SELECT count(*)::integer FROM queue.history_default), 0, 'the default partition is then empty');
SELECT results_eq(format('SELECT id, stage FROM %s', (SELECT partition FROM r4)), $$VALUES (-4::bigint, 'rp.keep')$$,
                  'the plain table holds the rows, for the DBA to archive');
SELECT ok(obj_description((SELECT partition FROM r4)::regclass, 'pg_class') LIKE 'Finished tasks of 2433-01-03 05:00:00 to 2433-01-03 05:00:00 UTC, copied out of queue.history_default%',
          'its comment says what it holds');
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, finished)
VALUES (-5, 'rp.keep', 'done', 0, '2433-01-04 05:00+00', '{}', 1, '2433-01-04 05:00+00', '2433-01-04 05:00+00');
SELECT results_eq($$SELECT action, partition <> (SELECT partition FROM r4)
                      FROM queue.rotate_partitions('2433-03-01 12:00+00') WHERE partition LIKE 'queue.history_default%'$$,
                  $$VALUES ('detached', true)$$,
                  'a second copy right after the first gets a name of its own (no clash within a second)');

-- A table of the same name blocks one partition, not the rotation --------------------------------------------
SELECT pg_temp.reset();
CREATE TABLE queue.history_24311202 (id integer);
SELECT lives_ok($$SELECT queue.configure_history(premake => 1)$$, 'setup: 1 day ahead');
SELECT results_eq($$SELECT action, partition FROM queue.rotate_partitions('2431-12-01 12:00+00') ORDER BY partition$$,
                  $$VALUES ('created', 'queue.history_24311201'), ('skipped: name taken', 'queue.history_24311202')$$,
                  'a table already named like a partition is reported as skipped: name taken; the rest is done');

-- Errors and roles ----------------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT * FROM queue.rotate_partitions(NULL)$$, '22004', 'now must not be NULL',
                 'rotate_partitions(NULL) raises 22004');
SET LOCAL ROLE skiplock_worker;
SELECT throws_ok($$SELECT * FROM queue.rotate_partitions()$$, '42501', 'permission denied for function rotate_partitions',
                 'skiplock_worker may not rotate partitions (42501)');
RESET ROLE;
SET LOCAL ROLE skiplock_monitor;
SELECT throws_ok($$SELECT * FROM queue.rotate_partitions()$$, '42501', 'permission denied for function rotate_partitions',
                 'skiplock_monitor may not rotate partitions (42501)');
RESET ROLE;
SET LOCAL ROLE skiplock_admin;
SELECT lives_ok($$SELECT * FROM queue.rotate_partitions()$$, 'skiplock_admin may rotate partitions');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
