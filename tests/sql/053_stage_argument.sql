-- The trailing stage argument of the calls that end, renew or change a task (what routes them
-- when the table is distributed by stage): with the task's stage a call does what it does
-- without one; with another stage it changes nothing and answers as for a stale lease (false,
-- SK001) or, for the admin calls, as for an unknown id (P0002); NULL is the call as before.
-- The primary key is (id, stage), and a lookup by id alone still probes it.
BEGIN;
SELECT plan(57);

CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, lease uuid);
CREATE FUNCTION pg_temp.take(p_name text, p_stage text) RETURNS void LANGUAGE sql AS $$
    INSERT INTO took SELECT p_name, k.id, k.lease FROM queue.take_next(p_stage) k;
$$;
CREATE FUNCTION pg_temp.row_of(p_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT t::text FROM queue.live_tasks t WHERE t.id = p_id;
$$;

-- The key.
SELECT col_is_pk('queue', 'live_tasks', ARRAY['id', 'stage'], 'the primary key of queue.live_tasks is (id, stage)');
SELECT is((SELECT c.conname::text FROM pg_catalog.pg_constraint c
            WHERE c.conrelid = 'queue.live_tasks'::regclass AND c.contype = 'p'), 'live_tasks_pkey',
          'it keeps the name live_tasks_pkey');

-- finish
SELECT queue.enqueue('{}', 'st.a') AS a1 \gset
SELECT queue.enqueue('{}', 'st.a') AS a2 \gset
SELECT queue.enqueue('{}', 'st.a') AS a3 \gset
SELECT pg_temp.take('a1', 'st.a'), pg_temp.take('a2', 'st.a'), pg_temp.take('a3', 'st.a');
CREATE TEMP TABLE before AS SELECT t.id, t::text AS r FROM queue.live_tasks t;
SELECT is(queue.finish(id, lease, stage => 'st.other'), false, 'finish with another stage returns false')
  FROM took WHERE name = 'a1';
SELECT is(pg_temp.row_of(:a1), (SELECT r FROM before WHERE id = :a1), '… and leaves the task as it was');
SELECT is(queue.finish(id, lease, 'st.b', stage => 'st.other'), false, 'finish(next_stage) with another stage returns false')
  FROM took WHERE name = 'a1';
SELECT is(pg_temp.row_of(:a1), (SELECT r FROM before WHERE id = :a1), '… and leaves the task where it was');
SELECT is(queue.finish(id, lease, stage => 'st.a'), true, 'finish with the task''s stage ends it') FROM took WHERE name = 'a1';
SELECT is((SELECT status::text || ' ' || stage FROM queue.history WHERE id = :a1), 'done st.a', '… as done');
SELECT is(queue.finish(id, lease, 'st.b', stage => 'st.a'), true, 'finish(next_stage) with the task''s stage moves it on')
  FROM took WHERE name = 'a2';
SELECT is((SELECT status::text || ' ' || stage FROM queue.live_tasks WHERE id = :a2), 'ready st.b', '… into next_stage');
SELECT is(queue.finish(id, lease, stage => NULL), true, 'finish with stage NULL ends the task as before') FROM took WHERE name = 'a3';

-- A periodic task and a re-run: the other paths of finish filter too.
SELECT queue.enqueue('{}', 'st.p', repeat => interval '1 hour') AS p1 \gset
SELECT pg_temp.take('p1', 'st.p');
SELECT is(queue.finish(id, lease, stage => 'st.other'), false, 'finish of a periodic task with another stage returns false')
  FROM took WHERE name = 'p1';
SELECT is(queue.finish(id, lease, 'st.b', stage => 'st.other'), false,
          'finish(next_stage) of a periodic task with another stage returns false (not 22023: it is not that stage''s task)')
  FROM took WHERE name = 'p1';
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = :p1), 'running', '… and the periodic task still runs');
SELECT is(queue.finish(id, lease, stage => 'st.p'), true, 'with its stage the periodic task is recorded and re-armed')
  FROM took WHERE name = 'p1';
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = :p1), 'ready', '… ready for its next run');
SELECT queue.enqueue('{}', 'st.r', key => 'r1') AS r1 \gset
SELECT pg_temp.take('r1', 'st.r');
SELECT queue.enqueue('{"again": true}', 'st.r', key => 'r1', mode => 'rerun');
SELECT is(queue.finish(id, lease, stage => 'st.other'), false, 'finish of a re-run task with another stage returns false')
  FROM took WHERE name = 'r1';
SELECT is((SELECT status::text || ' ' || rerun FROM queue.live_tasks WHERE id = :r1), 'running true', '… and leaves it running');
SELECT is(queue.finish(id, lease, stage => 'st.r'), true, 'with its stage the re-run task is queued again') FROM took WHERE name = 'r1';

-- fail
SELECT queue.enqueue('{}', 'st.f') AS f1 \gset
SELECT queue.enqueue('{}', 'st.f') AS f2 \gset
SELECT pg_temp.take('f1', 'st.f'), pg_temp.take('f2', 'st.f');
DELETE FROM before; INSERT INTO before SELECT t.id, t::text FROM queue.live_tasks t;
SELECT is(queue.fail(id, lease, 'boom', stage => 'st.other'), false, 'fail with another stage returns false') FROM took WHERE name = 'f1';
SELECT is(queue.fail(id, lease, 'boom', fatal => true, stage => 'st.other'), false, 'a fatal fail with another stage returns false')
  FROM took WHERE name = 'f1';
SELECT is(pg_temp.row_of(:f1), (SELECT r FROM before WHERE id = :f1), '… and leaves the task as it was');
SELECT is(queue.fail(id, lease, 'boom', stage => 'st.f'), true, 'fail with the task''s stage fails it') FROM took WHERE name = 'f1';
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = :f1), 'error', '… to be retried');
SELECT is(queue.fail(id, lease, 'boom', fatal => true), true, 'fail without a stage as before') FROM took WHERE name = 'f2';

-- heartbeat
SELECT queue.enqueue('{}', 'st.h') AS h1 \gset
SELECT pg_temp.take('h1', 'st.h');
DELETE FROM before; INSERT INTO before SELECT t.id, t::text FROM queue.live_tasks t;
SELECT throws_ok(format('SELECT queue.heartbeat(%s, %L, stage => %L)', id, lease, 'st.other'), 'SK001', 'lease lost',
                 'heartbeat with another stage raises SK001, as for a lost lease') FROM took WHERE name = 'h1';
SELECT is(pg_temp.row_of(:h1), (SELECT r FROM before WHERE id = :h1), '… and leaves the lease as it was');
SELECT is(queue.heartbeat(id, lease, interval '2 hours', stage => 'st.h'), now() + interval '2 hours',
          'heartbeat with the task''s stage renews the lease') FROM took WHERE name = 'h1';
SELECT is(queue.heartbeat(id, lease, interval '3 hours', NULL), now() + interval '3 hours', 'heartbeat with stage NULL as before')
  FROM took WHERE name = 'h1';

-- release
SELECT queue.enqueue('{}', 'st.l') AS l1 \gset
SELECT pg_temp.take('l1', 'st.l');
DELETE FROM before; INSERT INTO before SELECT t.id, t::text FROM queue.live_tasks t;
SELECT is(queue.release(id, lease, stage => 'st.other'), false, 'release with another stage returns false') FROM took WHERE name = 'l1';
SELECT is(pg_temp.row_of(:l1), (SELECT r FROM before WHERE id = :l1), '… and leaves the task running');
SELECT is(queue.release(id, lease, stage => 'st.l'), true, 'release with the task''s stage hands it back') FROM took WHERE name = 'l1';

-- finish_batch: tasks of another stage than the one given are skipped.
SELECT queue.enqueue('{}', 'st.b1') AS b1 \gset
SELECT queue.enqueue('{}', 'st.b1') AS b2 \gset
SELECT queue.enqueue('{}', 'st.b2') AS b3 \gset
SELECT pg_temp.take('b1', 'st.b1'), pg_temp.take('b2', 'st.b1'), pg_temp.take('b3', 'st.b2');
SELECT is(queue.finish_batch(ARRAY(SELECT id FROM took WHERE name LIKE 'b_' ORDER BY name),
                             ARRAY(SELECT lease FROM took WHERE name LIKE 'b_' ORDER BY name), stage => 'st.other'), 0,
          'finish_batch with another stage ends nothing');
SELECT is(queue.finish_batch(ARRAY(SELECT id FROM took WHERE name LIKE 'b_' ORDER BY name),
                             ARRAY(SELECT lease FROM took WHERE name LIKE 'b_' ORDER BY name), stage => 'st.b1'), 2,
          'finish_batch with a stage ends the tasks of that stage');
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = :b3), 'running', '… and skips the others');
SELECT is(queue.finish_batch(ARRAY(SELECT id FROM took WHERE name = 'b3'), ARRAY(SELECT lease FROM took WHERE name = 'b3')), 1,
          'finish_batch without a stage as before');

-- finish_and_take finishes only a task of the stage it takes from.
SELECT queue.enqueue('{}', 'st.t1') AS t1 \gset
SELECT pg_temp.take('t1', 'st.t1');
SELECT is((SELECT f.finished FROM took, queue.finish_and_take(took.id, took.lease, 'st.t2') f WHERE took.name = 't1' LIMIT 1), false,
          'finish_and_take does not finish a task of another stage than the one it takes from');
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = :t1), 'running', '… which still runs');
SELECT is((SELECT f.finished FROM took, queue.finish_and_take(took.id, took.lease, 'st.t1') f WHERE took.name = 't1' LIMIT 1), true,
          'finish_and_take finishes a task of its stage');

-- finish_locked and fail_locked
SELECT queue.enqueue('{}', 'st.k') AS k1 \gset
SELECT queue.enqueue('{}', 'st.k') AS k2 \gset
SELECT count(*) FROM queue.take_locked('st.k', 2);
SELECT is(queue.finish_locked(:k1, stage => 'st.other'), false, 'finish_locked with another stage returns false');
SELECT is(queue.fail_locked(:k2, 'boom', stage => 'st.other'), false, 'fail_locked with another stage returns false');
SELECT is((SELECT count(*)::integer FROM queue.live_tasks WHERE id IN (:k1, :k2) AND status = 'ready' AND attempt = 0), 2,
          '… and both tasks are as they were');
SELECT is(queue.finish_locked(:k1, stage => 'st.k'), true, 'finish_locked with the task''s stage ends it');
SELECT is(queue.fail_locked(:k2, 'boom', stage => 'st.k'), true, 'fail_locked with the task''s stage fails it');

-- cancel, retry, set_priority: another stage is an unknown task there (P0002).
SELECT queue.enqueue('{}', 'st.c') AS c1 \gset
SELECT throws_ok(format('SELECT queue.cancel(%s, %L)', :c1, 'st.other'), 'P0002', format('task %s not found', :c1),
                 'cancel with another stage raises P0002');
SELECT throws_ok(format('SELECT queue.set_priority(%s, 5, %L)', :c1, 'st.other'), 'P0002', NULL,
                 'set_priority with another stage raises P0002');
SELECT is((SELECT status::text || ' ' || priority FROM queue.live_tasks WHERE id = :c1), 'ready 0', '… and the task is unchanged');
SELECT lives_ok(format('SELECT queue.set_priority(%s, 5, %L)', :c1, 'st.c'), 'set_priority with the task''s stage');
SELECT lives_ok(format('SELECT queue.cancel(%s, %L)', :c1, 'st.c'), 'cancel with the task''s stage');
SELECT is((SELECT status::text || ' ' || priority FROM queue.history WHERE id = :c1), 'cancelled 5', '… cancels it');
SELECT throws_ok(format('SELECT queue.retry(%s, %L)', :c1, 'st.other'), 'P0002', NULL,
                 'retry of a cancelled task with another stage raises P0002');
SELECT lives_ok(format('SELECT queue.retry(%s, %L)', :c1, 'st.c'), 'retry with the task''s stage');
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = :c1), 'ready', '… queues it again');
SELECT throws_ok(format('SELECT queue.cancel(%s, %L)', :a1, 'st.a'), '55000', NULL,
                 'cancel of a finished task with its stage raises 55000, as without one');

-- The filter keeps the lookup on the primary key (id leads it) in a generic plan, the one
-- finish, fail and release keep (plan_cache_mode = force_generic_plan): with a stage and without one.
-- A backlog of 5,000 tasks in 10 stages (on a handful of rows a Seq Scan is the cheaper plan).
INSERT INTO queue.live_tasks (stage, payload)
SELECT 'st.plan' || (g % 10), '{}' FROM pg_catalog.generate_series(1, 5000) AS g;
ANALYZE queue.live_tasks;
SET LOCAL plan_cache_mode = force_generic_plan;
PREPARE by_id(bigint, uuid, text) AS
    DELETE FROM queue.live_tasks t
     WHERE t.id = $1 AND t.lease = $2 AND NOT t.rerun AND t.repeat IS NULL
       AND ($3 IS NULL OR t.stage = $3)
    RETURNING t.id;
SELECT matches(public.plan_text($$EXECUTE by_id(1, gen_random_uuid(), 'st.a')$$), 'Index Scan using live_tasks_pkey',
               'the generic plan of finish''s statement with a stage probes live_tasks_pkey');
SELECT matches(public.plan_text($$EXECUTE by_id(1, gen_random_uuid(), NULL)$$), 'Index Scan using live_tasks_pkey',
               '… and without one');
SELECT doesnt_match(public.plan_text($$EXECUTE by_id(1, gen_random_uuid(), NULL)$$), 'Seq Scan', '… never a Seq Scan');

SELECT * FROM finish();
ROLLBACK;
