-- Multi-stage takes: take_next, take_locked and consume with stages text[] (names and prefixes
-- ending in '*') serve the stages in a round robin by weight that goes on from the session's last
-- turn (skiplock.turn), so that a large backlog starves no other stage. A stage found by a prefix
-- that the caller may not take (restricted, or limited for take_locked/consume) is skipped; one
-- named outright raises as the single-stage call does. (100,000 tasks against 50 small stages,
-- and the wake-ups of a multi-stage worker: tests/py/test_take_stages.py.)
BEGIN;
SELECT plan(38);

CREATE ROLE skiplock_t_ms_worker LOGIN IN ROLE skiplock_worker;
CREATE TEMP TABLE took (seq serial PRIMARY KEY, stage text, id bigint);
GRANT ALL ON took TO PUBLIC;
GRANT ALL ON SEQUENCE took_seq_seq TO PUBLIC;
CREATE FUNCTION pg_temp.take(stages text[], batch integer DEFAULT 1) RETURNS text LANGUAGE sql AS $$
    WITH t AS (INSERT INTO took (stage, id) SELECT t.stage, t.id FROM queue.take_next($1, $2) t RETURNING stage, seq)
    SELECT coalesce(string_agg(stage, ',' ORDER BY seq), '') FROM t
$$;

-- The overloads: one stage keeps take_next's shape; an array gets the stage of each row ------------------------------
SELECT is(pg_catalog.pg_get_function_result('queue.take_next(text[],integer,interval,text)'::regprocedure),
          'TABLE(stage text, id bigint, payload jsonb, attempt integer, lease uuid, lease_expires timestamp with time zone, priority integer, key text)',
          'take_next(stages text[]) returns each task with its stage');
SELECT is((SELECT count(*)::integer FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[3]), 'ms.a')), 3, 'three tasks in ms.a');
SELECT is((SELECT count(*)::integer FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[1]), 'ms.b')), 1, 'one in ms.b');
SELECT is((SELECT count(*)::integer FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[1]), 'ms.c')), 1, 'one in ms.c');
SELECT is((SELECT count(*)::integer FROM queue.take_next('ms.a')), 1, 'take_next(''ms.a'') is still the single-stage call');

-- Round robin over names ------------------------------------------------------------------------------------------------
SELECT is(pg_temp.take(ARRAY['ms.c', 'ms.a', 'ms.b']), 'ms.a', 'the first take of a session starts at the first stage in sort order');
SELECT is(current_setting('skiplock.turn'), '1/ms.a', 'and records its turn in skiplock.turn');
SELECT is(pg_temp.take(ARRAY['ms.c', 'ms.a', 'ms.b']), 'ms.b', 'the next take goes on with the next stage');
SELECT is(pg_temp.take(ARRAY['ms.c', 'ms.a', 'ms.b']), 'ms.c', 'and the next');
SELECT is(pg_temp.take(ARRAY['ms.c', 'ms.a', 'ms.b'], 5), 'ms.a', 'past the last it wraps around; empty stages give nothing');
SELECT is(pg_temp.take(ARRAY['ms.c', 'ms.a', 'ms.b'], 5), '', 'all empty: nothing');
SELECT results_eq($$SELECT stage FROM queue.stage_waiters WHERE stage LIKE 'ms.%' ORDER BY 1$$,
                  ARRAY['ms.a', 'ms.b', 'ms.c'], 'a take that found its stages empty marks each as waited on (enqueues wake it)');

-- A lease from a multi-stage take finishes as any
SELECT is((SELECT count(*)::integer FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2]), 'ms.f')), 2, 'two tasks in ms.f');
SELECT ok((SELECT bool_and(queue.finish(t.id, t.lease, stage => t.stage)) FROM queue.take_next(ARRAY['ms.f'], 2) t),
          'the tasks of a multi-stage take finish with their lease and stage');

-- Weight ----------------------------------------------------------------------------------------------------------------
SELECT is((queue.configure_stage('ms.w1', weight => 3)).weight, 3, 'configure_stage sets a stage''s weight');
SELECT is((SELECT count(*)::integer FROM (VALUES ('ms.w1'), ('ms.w2')) v(s)
             CROSS JOIN LATERAL queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[8]), v.s) e), 16, 'eight tasks in ms.w1 and in ms.w2');
SELECT is(pg_temp.take(ARRAY['ms.w*'], 8), 'ms.w1,ms.w1,ms.w1,ms.w2,ms.w1,ms.w1,ms.w1,ms.w2',
          'a batch serves weight 3 of ms.w1 for each 1 of ms.w2 (prefix ms.w*)');
SELECT is(pg_temp.take(ARRAY['ms.w*']) || pg_temp.take(ARRAY['ms.w*']) || pg_temp.take(ARRAY['ms.w*']),
          'ms.w1ms.w1ms.w2', 'takes of one go on with a turn over calls: ms.w1 until it runs dry, then ms.w2');

-- Prefixes and access ---------------------------------------------------------------------------------------------
SELECT lives_ok($$SELECT queue.grant_stage('ms.p.secret', 'skiplock_t_ms_worker')$$, 'ms.p.secret is restricted to another role');
SELECT is((SELECT count(*)::integer FROM (VALUES ('ms.p.open'), ('ms.p.secret')) v(s)
             CROSS JOIN LATERAL queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2]), v.s) e), 4, 'two tasks in ms.p.open and in ms.p.secret');
CREATE ROLE skiplock_t_ms_other LOGIN IN ROLE skiplock_worker;
SET ROLE skiplock_t_ms_other;
SELECT is(pg_temp.take(ARRAY['ms.p.*'], 10), 'ms.p.open,ms.p.open',
          'a restricted stage found by a prefix is skipped for a role without its take right');
SELECT throws_ok($$SELECT * FROM queue.take_next(ARRAY['ms.p.secret'])$$, '42501', NULL,
                 'named outright, a restricted stage raises 42501 as take_next(stage) does');
RESET ROLE;
SET ROLE skiplock_t_ms_worker;
SELECT is(pg_temp.take(ARRAY['ms.p.*'], 10), 'ms.p.secret,ms.p.secret', 'a role granted the stage takes from it through the prefix');
RESET ROLE;

-- take_locked and consume -------------------------------------------------------------------------------------------
DO $$ BEGIN PERFORM queue.configure_stage('ms.l.max', max_running => 1); PERFORM queue.configure_stage('ms.k.max', max_running => 1); END $$;
SELECT is((SELECT count(*)::integer FROM (VALUES ('ms.l.free'), ('ms.l.max'), ('ms.k.free'), ('ms.k.max')) v(s)
             CROSS JOIN LATERAL queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2]), v.s) e), 8,
          'two tasks in ms.l.free, ms.l.max, ms.k.free and ms.k.max (the .max ones with max_running 1)');
SELECT results_eq($$SELECT stage FROM queue.take_locked(ARRAY['ms.l.*'], 10)$$, ARRAY['ms.l.free', 'ms.l.free'],
                  'take_locked through a prefix skips the limited stage');
SELECT throws_ok($$SELECT * FROM queue.take_locked(ARRAY['ms.l.max'])$$, '0A000', NULL,
                 'take_locked with the limited stage named raises 0A000');
SELECT results_eq($$SELECT stage FROM queue.consume(ARRAY['ms.k.*', 'ms.b'], 10)$$, ARRAY['ms.k.free', 'ms.k.free'],
                  'consume(stages) consumes from the stages, skipping the limited one found by a prefix');
SELECT is((SELECT count(*)::integer FROM queue.history WHERE stage = 'ms.k.free' AND status = 'done'), 2, 'and records them as done');

-- Arguments -----------------------------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT * FROM queue.take_next(NULL::text[])$$, '22004', 'stages must not be NULL', 'NULL stages: 22004');
SELECT throws_ok($$SELECT * FROM queue.take_next('{}'::text[])$$, '22023', 'stages must hold 1 to 1000 elements', 'no stages: 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next(ARRAY['ms.a', ''])$$, '22023', 'invalid stages element name', 'an empty name: 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next(ARRAY['ms.a', NULL])$$, '22004', 'stages element must not be NULL', 'a NULL element: 22004');
SELECT throws_ok($$SELECT * FROM queue.take_next(ARRAY['*'])$$, '22023', 'invalid stages element name', '''*'' alone (every stage) is refused: 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next(ARRAY['ms.a'], 0)$$, '22023', 'batch out of range', 'batch 0: 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next(ARRAY(SELECT 'ms.n.' || g FROM generate_series(1, 1001) g))$$, '22023',
                 'stages must hold 1 to 1000 elements', '1,001 stages: 22023');
SELECT is((SELECT count(*)::integer FROM queue.take_next(ARRAY(SELECT 'ms.n.' || g FROM generate_series(1, 1000) g))), 0,
          '1,000 stages are taken from (none has a task)');
SELECT throws_ok(format('SELECT * FROM queue.take_next(ARRAY[%L])', repeat('p', 54) || '*'), '22023', 'invalid stages prefix name',
                 'a prefix of 55 bytes: 22023');
SELECT is((SELECT count(*)::integer FROM queue.take_next(ARRAY[repeat('p', 53) || '*'])), 0, 'a prefix of 54 bytes is taken from');

SELECT * FROM finish();
ROLLBACK;
