-- drain: consume for one consumer a stage. One session: order, what it leaves, the checks it
-- shares with consume. A second drainer, and the other calls on the same tasks
-- in other sessions: tests/py/test_drain.py.
BEGIN;
SELECT plan(11);

SELECT queue.enqueue('{"n": 1}', 'dr.a', priority => 2) AS a1 \gset
SELECT queue.enqueue('{"n": 2}', 'dr.a', priority => 1) AS a2 \gset
SELECT queue.enqueue('{"n": 3}', 'dr.a', run_at => now() + interval '1 hour') AS a3 \gset
SELECT queue.enqueue('{"n": 4}', 'dr.a', repeat => interval '1 hour') AS a4 \gset

SELECT results_eq($$SELECT id, payload, attempt, priority FROM queue.drain('dr.a', 10)$$,
                  format('VALUES (%s::bigint, ''{"n": 2}''::jsonb, 1, 1), (%s, ''{"n": 1}'', 1, 2)', :a2, :a1),
                  'drain returns the due tasks in take_next''s order, each with the attempt it ran as; periodic and future ones stay');
SELECT set_eq($$SELECT id FROM queue.live_tasks WHERE stage = 'dr.a'$$, format('VALUES (%s::bigint), (%s)', :a3, :a4),
              'the task not due and the periodic task are left');
SELECT results_eq(format('SELECT status::text, attempt, started FROM queue.history WHERE id IN (%s, %s) ORDER BY id', :a1, :a2),
                  $$VALUES ('done', 1, now()), ('done', 1, now())$$, 'each drained task is done in queue.history');
SELECT is((SELECT total FROM queue.finished_totals WHERE stage = 'dr.a' AND status = 'done'), 2::bigint, 'and counted');
SELECT is_empty($$SELECT 1 FROM queue.drain('dr.a')$$, 'nothing due: nothing');
SELECT ok((SELECT until > now() FROM queue.stage_waiters WHERE stage = 'dr.a'), 'and the stage is marked as waited on');

-- Busy (another drainer holds the stage): tests/py/test_drain.py; one session re-enters its own lock.
SELECT queue.enqueue('{}', 'dr.c') FROM generate_series(1, 3);
SELECT is((SELECT count(*)::integer FROM queue.drain('dr.c', 2)), 2, 'batch bounds what one call drains');
SELECT is((SELECT count(*)::integer FROM queue.drain('dr.c', 2)), 1, 'and the same session drains again in its transaction');

SELECT throws_ok($$SELECT * FROM queue.drain('dr.a', 0)$$, '22023', NULL, 'batch out of range: 22023');
SELECT queue.configure_stage('dr.cap', max_running => 2);
SELECT throws_ok($$SELECT * FROM queue.drain('dr.cap')$$, '0A000', NULL, 'a stage with max_running: 0A000, as consume');
SELECT queue.configure_stage('dr.p', paused => true);
SELECT queue.enqueue('{}', 'dr.p');
SELECT is_empty($$SELECT 1 FROM queue.drain('dr.p')$$, 'a paused stage: nothing');

SELECT * FROM finish();
ROLLBACK;
