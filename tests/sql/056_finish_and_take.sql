-- finish_and_take: finish the attempt just completed and take the next task, in one call and
-- one transaction; what it returns in each case, and that a failing take undoes the finish.
BEGIN;
SELECT plan(12);

SELECT queue.enqueue('{"n": 1}', 'fat', priority => 1);
SELECT queue.enqueue('{"n": 2}', 'fat', priority => 2);
CREATE TEMP TABLE step AS SELECT * FROM queue.finish_and_take(NULL, NULL, 'fat');
SELECT results_eq($$SELECT finished, payload, attempt FROM step$$, $$VALUES (NULL::boolean, '{"n": 1}'::jsonb, 1)$$,
                  'the first call (nothing to finish) takes the first task; finished is NULL');

CREATE TEMP TABLE step2 AS SELECT f.* FROM step s, queue.finish_and_take(s.id, s.lease, 'fat') f;
SELECT results_eq($$SELECT finished, payload FROM step2$$, $$VALUES (true, '{"n": 2}'::jsonb)$$,
                  'the next call finishes the first task and takes the second');
SELECT results_eq($$SELECT h.status::text FROM queue.history h JOIN step USING (id)$$, $$VALUES ('done')$$,
                  'the first task is done, in history');
SELECT results_eq($$SELECT t.status::text, t.lease = s.lease FROM queue.live_tasks t JOIN step2 s USING (id)$$,
                  $$VALUES ('running', true)$$, 'the second runs under the lease returned');

CREATE TEMP TABLE step3 AS SELECT f.* FROM step2 s, queue.finish_and_take(s.id, s.lease, 'fat') f;
SELECT results_eq($$SELECT finished, id, payload, lease FROM step3$$, $$VALUES (true, NULL::bigint, NULL::jsonb, NULL::uuid)$$,
                  'nothing due: one row with finished and nothing else');
SELECT is((SELECT count(*) FROM queue.live_tasks WHERE stage = 'fat'), 0::bigint, 'the stage is empty');

SELECT queue.enqueue('{"n": 3}', 'fat');
SELECT results_eq($$SELECT f.finished, f.payload FROM step2 s, queue.finish_and_take(s.id, s.lease, 'fat') f$$,
                  $$VALUES (false, '{"n": 3}'::jsonb)$$, 'a stale lease: finished is false, and the next task is still taken');

SELECT queue.enqueue('{"n": 4}', 'fat2');
SELECT queue.enqueue('{"n": 5}', 'fat2');
CREATE TEMP TABLE four AS SELECT * FROM queue.take_next('fat2');
SELECT throws_ok($$SELECT * FROM queue.finish_and_take((SELECT id FROM four), (SELECT lease FROM four), 'fat2', batch => 0)$$,
                 '22023', 'batch out of range', 'a bad take argument raises');
SELECT results_eq($$SELECT t.status::text FROM queue.live_tasks t JOIN four USING (id)$$, $$VALUES ('running')$$,
                  'and the finish of the same call is undone: the task still runs');
SELECT results_eq($$SELECT count(*) FROM queue.finish_and_take((SELECT id FROM four), (SELECT lease FROM four), 'fat2', batch => 5)$$,
                  $$VALUES (1::bigint)$$, 'batch: every due task up to batch (here the one left)');

SELECT throws_ok($$SELECT * FROM queue.finish_and_take(1, NULL, 'fat')$$, '22004', 'finished_id and finished_lease must be given together',
                 'an id without a lease is 22004');
SELECT throws_ok($$SELECT * FROM queue.finish_and_take(NULL, gen_random_uuid(), 'fat')$$, '22004', NULL,
                 'a lease without an id is 22004');

SELECT * FROM finish();
ROLLBACK;
