-- consume: take up to batch due tasks and record them as done in one statement, in the caller's
-- transaction. Order as take_next; a rollback gives them back; periodic and SQL tasks are left
-- alone. (Concurrent consumers: tests/py/test_consume.py.)
BEGIN;
SELECT plan(28);

-- Order: priority, then run_at, then id; tasks not due are left.
SELECT queue.enqueue('{"n": 1}', 'cs.a', priority => 2) AS a1 \gset
SELECT queue.enqueue('{"n": 2}', 'cs.a', priority => 1) AS a2 \gset
SELECT queue.enqueue('{"n": 3}', 'cs.a', priority => 1, key => 'k3') AS a3 \gset
SELECT queue.enqueue('{"n": 4}', 'cs.a', run_at => now() + interval '1 hour') AS a4 \gset
SELECT queue.enqueue('{"n": 5}', 'cs.a', priority => 3) AS a5 \gset
CREATE TEMP TABLE a_before AS SELECT * FROM queue.live_tasks WHERE stage = 'cs.a';

SAVEPOINT given_back;
SELECT results_eq($$SELECT id, payload, attempt, priority, key FROM queue.consume('cs.a', 2)$$,
                  format('VALUES (%s::bigint, ''{"n": 2}''::jsonb, 1, 1, NULL::text), (%s, ''{"n": 3}'', 1, 1, ''k3'')', :a2, :a3),
                  'consume returns the first batch due tasks in priority, run_at, id order, each with the attempt it ran as');
SELECT is_empty(format('SELECT 1 FROM queue.live_tasks WHERE id IN (%s, %s)', :a2, :a3),
                'the consumed tasks leave queue.live_tasks');
SELECT results_eq(format('SELECT id, status::text, stage, attempt, payload, key, started FROM queue.history WHERE id IN (%s, %s) ORDER BY id', :a2, :a3),
                  format($$VALUES (%s::bigint, 'done', 'cs.a', 1, '{"n": 2}'::jsonb, NULL::text, now()), (%s, 'done', 'cs.a', 1, '{"n": 3}', 'k3', now())$$, :a2, :a3),
                  'each is one done row in queue.history, with its attempt, and the transaction''s start as started');
SELECT ok((SELECT bool_and(finished >= now()) FROM queue.history WHERE id IN (:a2, :a3)), 'finished is the clock time of the consume');
SELECT is((SELECT count(*)::integer FROM queue.enqueue('{"n": 6}', 'cs.a', key => 'k3')), 1,
          'the key of a consumed task is free again');
ROLLBACK TO SAVEPOINT given_back;
SELECT set_eq('SELECT * FROM queue.live_tasks WHERE stage = ''cs.a''', 'SELECT * FROM a_before',
              'a rollback gives every consumed task back as it was');
SELECT is_empty('SELECT 1 FROM queue.history WHERE stage = ''cs.a''', 'and takes its history rows back');

SELECT results_eq($$SELECT id FROM queue.consume('cs.a')$$,
                  format('VALUES (%s::bigint), (%s), (%s), (%s)', :a2, :a3, :a1, :a5),
                  'the default batch takes every due task (up to 100), in order');
SELECT results_eq($$SELECT id FROM queue.live_tasks WHERE stage = 'cs.a'$$, format('VALUES (%s::bigint)', :a4),
                  'the task not yet due is left');
SELECT is_empty($$SELECT 1 FROM queue.consume('cs.a', 10000)$$, 'nothing due: nothing consumed');
SELECT ok((SELECT until > now() + interval '50 seconds' FROM queue.stage_waiters WHERE stage = 'cs.a'),
          'a consume that finds nothing due marks the stage as waited on');

-- Batch bounds.
SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[5]), 'cs.b');
SELECT is((SELECT count(*)::integer FROM queue.consume('cs.b', 1)), 1, 'batch 1 consumes one task');
SELECT is((SELECT count(*)::integer FROM queue.consume('cs.b', 3)), 3, 'batch 3 consumes three');
SELECT is((SELECT count(*)::integer FROM queue.consume('cs.b', 10000)), 1, 'batch 10000 consumes what is left');
SELECT throws_ok($$SELECT * FROM queue.consume('cs.b', 0)$$, '22023', 'batch out of range', 'batch 0 is 22023');
SELECT throws_ok($$SELECT * FROM queue.consume('cs.b', 10001)$$, '22023', 'batch out of range', 'batch 10001 is 22023');
SELECT throws_ok($$SELECT * FROM queue.consume('cs.b', NULL)$$, '22023', NULL, 'a NULL batch is 22023');
SELECT throws_ok($$SELECT * FROM queue.consume(NULL)$$, '22004', NULL, 'a NULL stage is 22004');

-- A task due for a retry is consumed at its next attempt; periodic and SQL tasks are left alone.
SELECT queue.enqueue('{"n": 7}', 'cs.c') AS c1 \gset
SELECT lease AS c1_lease FROM queue.take_next('cs.c') \gset
SELECT queue.fail(:c1, :'c1_lease', 'boom', retry_in => '0');
SELECT queue.enqueue('{"n": 8}', 'cs.c', repeat => interval '1 hour') AS c2 \gset
SELECT queue.enqueue_sql('SELECT 1', 'cs.c') AS c3 \gset
SELECT results_eq($$SELECT id, attempt FROM queue.consume('cs.c', 10)$$, format('VALUES (%s::bigint, 2)', :c1),
                  'a failed task due again is consumed as its second attempt; a periodic and an SQL task are not');
SELECT results_eq(format('SELECT status::text, attempt, error_text FROM queue.history WHERE id = %s', :c1),
                  $$VALUES ('done', 2, 'boom')$$,
                  'its history row is done, at attempt 2, with the error of the attempt before');
SELECT results_eq($$SELECT id FROM queue.live_tasks WHERE stage = 'cs.c' ORDER BY id$$,
                  format('VALUES (%s::bigint), (%s)', :c2, :c3), 'the periodic and the SQL task stay live');

-- Stages it cannot serve.
SELECT queue.enqueue('{"n": 9}', 'cs.paused') AS z1 \gset
DO $$ BEGIN PERFORM queue.configure_stage('cs.paused', paused => true); END $$;
SELECT is_empty($$SELECT 1 FROM queue.consume('cs.paused')$$, 'a paused stage hands out nothing');
SELECT is((SELECT count(*)::integer FROM queue.live_tasks WHERE stage = 'cs.paused'), 1, 'its task stays live');
DO $$ BEGIN PERFORM queue.configure_stage('cs.max', max_running => 3); END $$;
SELECT throws_ok($$SELECT * FROM queue.consume('cs.max')$$, '0A000', 'stage ''cs.max'' has concurrency limits',
                 'a stage with max_running raises 0A000');
DO $$ BEGIN PERFORM queue.configure_stage('cs.grp', group_limit => 1); END $$;
SELECT throws_ok($$SELECT * FROM queue.consume('cs.grp')$$, '0A000', NULL, 'a stage with group_limit raises 0A000');

CREATE ROLE skiplock_t_consume_worker NOLOGIN IN ROLE skiplock_worker;
SELECT queue.enqueue('{"n": 10}', 'cs.r') AS r1 \gset
SELECT lives_ok($$SELECT queue.grant_stage('cs.r', 'skiplock_admin')$$, 'cs.r is restricted to admins');
SET ROLE skiplock_t_consume_worker;
SELECT throws_ok($$SELECT * FROM queue.consume('cs.r')$$, '42501', 'permission denied for stage cs.r',
                 'a worker without the take right on a restricted stage gets 42501');
RESET ROLE;

-- consume keeps one generic plan (plan_cache_mode = force_generic_plan), batch unknown: its
-- claim walks live_tasks_claim and its DELETE reads the claimed rows by address. (5,000 tasks in
-- 10 stages, analyzed: the plan before depends on what earlier tests and autovacuum left.)
INSERT INTO queue.live_tasks (stage, payload)
SELECT 'cs.plan' || (g % 10), '{}' FROM pg_catalog.generate_series(1, 5000) AS g;
SET LOCAL plan_cache_mode = force_generic_plan;
PREPARE consume_claim(text, timestamptz, integer) AS
    DELETE FROM queue.live_tasks t
     WHERE t.stage = $1 AND t.ctid = ANY (ARRAY(
               SELECT c.ctid
                 FROM queue.live_tasks c
                WHERE c.stage = $1
                  AND c.status IN ('ready', 'error')
                  AND c.run_as IS NULL
                  AND c.repeat IS NULL
                  AND c.run_at <= $2
                ORDER BY c.priority, c.run_at, c.id
                LIMIT $3
                  FOR UPDATE SKIP LOCKED))
    RETURNING t.id;
ANALYZE queue.live_tasks;
SELECT ok(public.plan_text($$EXECUTE consume_claim('cs.plan1', now(), 100)$$) ~ 'Index Scan using live_tasks_claim'
          AND public.plan_text($$EXECUTE consume_claim('cs.plan1', now(), 100)$$) ~ 'Tid Scan'
          AND public.plan_text($$EXECUTE consume_claim('cs.plan1', now(), 100)$$) !~ 'Seq Scan|Sort',
          'consume''s generic plan claims on live_tasks_claim and deletes by address, no Seq Scan or Sort');
RESET plan_cache_mode;

SELECT * FROM finish();
ROLLBACK;
