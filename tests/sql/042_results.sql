-- Results: finish, finish_locked, finish_batch and finish_and_take keep what a run returned in its
-- queue.history row (and queue.tasks shows it); with next_stage the result is the payload the task
-- carries into that stage; a periodic run keeps its result in its history row; the calls without a
-- result still work in every form (positional and named); a bad result raises and changes nothing.
BEGIN;
SELECT plan(37);

CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, lease uuid);
CREATE FUNCTION pg_temp.take(name text, stage text) RETURNS void LANGUAGE sql AS $$
    INSERT INTO took SELECT name, k.id, k.lease FROM queue.take_next(stage) k;
$$;
CREATE FUNCTION pg_temp.hist(name text) RETURNS TABLE (stage text, status text, result jsonb)
    LANGUAGE sql AS $$
    SELECT h.stage, h.status::text, h.result FROM queue.history h WHERE h.id = (SELECT t.id FROM took t WHERE t.name = hist.name)
     ORDER BY h.stage;
$$;

-- finish(…, result) ------------------------------------------------------------------------------------------------
SELECT queue.enqueue('{"n": 1}', 'res.a');
SELECT pg_temp.take('a', 'res.a');
SELECT is(queue.finish(id, lease, result => '{"thumb": "a.png"}'), true, 'finish with a result returns true')
  FROM took WHERE name = 'a';
SELECT results_eq($$SELECT * FROM pg_temp.hist('a')$$,
                  $$VALUES ('res.a', 'done', '{"thumb": "a.png"}'::jsonb)$$,
                  'the done history row keeps the result');
SELECT is((SELECT t.result FROM queue.tasks t WHERE t.id = (SELECT id FROM took WHERE name = 'a')),
          '{"thumb": "a.png"}'::jsonb, 'queue.tasks shows the result');

SELECT queue.enqueue('{"n": 2}', 'res.b');
SELECT pg_temp.take('b', 'res.b');
SELECT is(queue.finish(id, lease), true, 'finish(id, lease) without a result still works') FROM took WHERE name = 'b';
SELECT results_eq($$SELECT * FROM pg_temp.hist('b')$$, $$VALUES ('res.b', 'done', NULL::jsonb)$$,
                  'without a result the history row has none');

SELECT queue.enqueue('{"n": 3}', 'res.c');
SELECT pg_temp.take('c', 'res.c');
SELECT is(queue.finish(id, lease, NULL, 'res.c'), true, 'the positional four-argument form still works')
  FROM took WHERE name = 'c';
SELECT queue.enqueue('{"n": 4}', 'res.d');
SELECT pg_temp.take('d', 'res.d');
SELECT is(queue.finish(id => id, lease => lease, stage => 'res.d', result => '[1, 2]'), true,
          'named notation with stage and a JSON array result')
  FROM took WHERE name = 'd';
SELECT results_eq($$SELECT * FROM pg_temp.hist('d')$$, $$VALUES ('res.d', 'done', '[1, 2]'::jsonb)$$,
                  'an array result is kept');

-- A stale lease with a result: false, nothing written.
SELECT is(queue.finish(id, lease, result => '{"late": true}'), false, 'a stale lease with a result returns false')
  FROM took WHERE name = 'a';
SELECT is((SELECT count(*)::integer FROM queue.history WHERE id = (SELECT id FROM took WHERE name = 'a')), 1,
          'a stale finish with a result writes no second row');

-- Bad results raise before anything changes.
SELECT queue.enqueue('{"n": 5}', 'res.bad');
SELECT pg_temp.take('bad', 'res.bad');
SELECT throws_ok(format($$SELECT queue.finish(%s, %L, result => '42')$$, id, lease),
                 '22023', 'result must be a JSON object or array', 'a JSON number result raises 22023')
  FROM took WHERE name = 'bad';
SELECT throws_ok(format($$SELECT queue.finish(%s, %L, result => 'null')$$, id, lease),
                 '22023', 'result must be a JSON object or array', 'a JSON null result raises 22023')
  FROM took WHERE name = 'bad';
SELECT throws_ok(format($$SELECT queue.finish(%s, %L, result => jsonb_build_object('blob', repeat('x', 1100000)))$$, id, lease),
                 '54000', 'result too large', 'a result over 1 MiB raises 54000')
  FROM took WHERE name = 'bad';
SELECT throws_ok($$SELECT queue.finish(NULL, NULL, result => '{}')$$, '22004', 'id and lease must not be NULL',
                 'a NULL id or lease raises 22004 with a result too');
SELECT throws_ok($$SELECT queue.finish_locked(NULL, result => '{}')$$, '22004', 'id must not be NULL',
                 'finish_locked: a NULL id raises 22004 with a result too');
SELECT throws_ok($$SELECT queue.finish_locked(1, repeat('w', 201), result => '{}')$$, '22023', 'worker name too long',
                 'finish_locked: a long worker name raises 22023 with a result too');
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = 'bad')), 'running',
          'a refused result leaves the task running');

-- Pipelines: the result is the payload of the next stage ---------------------------------------------------------
SELECT queue.enqueue('{"image": "x.jpg"}', 'res.p1');
SELECT pg_temp.take('p', 'res.p1');
SELECT is(queue.finish(id, lease, 'res.p2', result => '{"image": "x.jpg", "thumb": "x.png"}'), true,
          'finish(next_stage, result) moves the task on')
  FROM took WHERE name = 'p';
SELECT is((SELECT k.payload FROM queue.take_next('res.p2') k), '{"image": "x.jpg", "thumb": "x.png"}'::jsonb,
          'the next stage''s worker gets the parent stage''s result as its payload');
SELECT results_eq($$SELECT * FROM pg_temp.hist('p')$$,
                  $$VALUES ('res.p1', 'done', '{"image": "x.jpg", "thumb": "x.png"}'::jsonb)$$,
                  'the first stage''s history row keeps its result');
SELECT is((SELECT h.payload FROM queue.history h WHERE h.id = (SELECT id FROM took WHERE name = 'p')),
          '{"image": "x.jpg"}'::jsonb, 'and the payload that stage worked on');
SELECT queue.enqueue('{"keep": 1}', 'res.q1');
SELECT pg_temp.take('q', 'res.q1');
SELECT queue.finish(id, lease, 'res.q2') FROM took WHERE name = 'q';
SELECT is((SELECT payload FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = 'q')), '{"keep": 1}'::jsonb,
          'without a result the payload moves on unchanged');

-- A periodic run keeps its result ----------------------------------------------------------------------------------
SELECT queue.enqueue('{}', 'res.per', repeat => interval '1 hour');
SELECT pg_temp.take('per', 'res.per');
SELECT is(queue.finish(id, lease, result => '{"rows": 7}'), true, 'a periodic task finishes with a result')
  FROM took WHERE name = 'per';
SELECT results_eq($$SELECT * FROM pg_temp.hist('per')$$, $$VALUES ('res.per', 'done', '{"rows": 7}'::jsonb)$$,
                  'its run''s history row keeps the result');
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = 'per')), 'ready',
          'and it is re-armed');

-- finish_locked(…, result) -----------------------------------------------------------------------------------------
SELECT queue.enqueue('{}', 'res.l');
INSERT INTO took SELECT 'l', k.id, NULL FROM queue.take_locked('res.l') k;
SELECT is(queue.finish_locked(id, result => '{"ok": true}'), true, 'finish_locked with a result') FROM took WHERE name = 'l';
SELECT results_eq($$SELECT * FROM pg_temp.hist('l')$$, $$VALUES ('res.l', 'done', '{"ok": true}'::jsonb)$$,
                  'finish_locked keeps the result');
SELECT queue.enqueue('{}', 'res.l2');
INSERT INTO took SELECT 'l2', k.id, NULL FROM queue.take_locked('res.l2') k;
SELECT throws_ok(format($$SELECT queue.finish_locked(%s, result => '"text"')$$, id),
                 '22023', 'result must be a JSON object or array', 'finish_locked refuses a scalar result')
  FROM took WHERE name = 'l2';
SELECT is(queue.finish_locked(id, 'w', 'res.l2'), true, 'the positional three-argument form still works')
  FROM took WHERE name = 'l2';

-- finish_batch(…, result[]) ----------------------------------------------------------------------------------------
SELECT queue.enqueue('{"i": 1}', 'res.fb'), queue.enqueue('{"i": 2}', 'res.fb'), queue.enqueue('{"i": 3}', 'res.fb');
CREATE TEMP TABLE batch AS SELECT k.id, k.lease, row_number() OVER (ORDER BY k.id) AS n FROM queue.take_next('res.fb', 3) k;
SELECT is(queue.finish_batch((SELECT array_agg(id ORDER BY n DESC) FROM batch), (SELECT array_agg(lease ORDER BY n DESC) FROM batch),
                             result => ARRAY['{"r": 3}', NULL, '{"r": 1}']::jsonb[]),
          3, 'finish_batch with results ends every pair');
SELECT results_eq($$SELECT b.n, h.result FROM batch b JOIN queue.history h ON h.id = b.id ORDER BY b.n$$,
                  $$VALUES (1::bigint, '{"r": 1}'::jsonb), (2, NULL), (3, '{"r": 3}')$$,
                  'each history row has the result of its own pair (a NULL element: none)');
SELECT queue.enqueue('{"i": 4}', 'res.fb2');
CREATE TEMP TABLE batch2 AS SELECT k.id, k.lease FROM queue.take_next('res.fb2') k;
SELECT throws_ok(format($$SELECT queue.finish_batch(ARRAY[%s], ARRAY[%L]::uuid[], result => ARRAY['{}', '{}']::jsonb[])$$, id, lease),
                 '22023', 'result must have one element per id', 'a result array of another length raises 22023')
  FROM batch2;
SELECT throws_ok(format($$SELECT queue.finish_batch(ARRAY[%s], ARRAY[%L]::uuid[], result => ARRAY['1']::jsonb[])$$, id, lease),
                 '22023', 'result[1] must be a JSON object or array', 'a scalar element raises 22023, naming its position')
  FROM batch2;

SELECT queue.enqueue('{}', 'res.fbp', repeat => interval '1 hour'), queue.enqueue('{}', 'res.fbp');
CREATE TEMP TABLE batch3 AS SELECT k.id, k.lease FROM queue.take_next('res.fbp', 2) k;
SELECT is(queue.finish_batch((SELECT array_agg(id ORDER BY id) FROM batch3), (SELECT array_agg(lease ORDER BY id) FROM batch3),
                             result => ARRAY['{"p": 1}', '{"p": 2}']::jsonb[]),
          2, 'finish_batch ends a periodic and a one-off task with results');
SELECT results_eq($$SELECT h.result FROM batch3 b JOIN queue.history h ON h.id = b.id ORDER BY b.id$$,
                  $$VALUES ('{"p": 1}'::jsonb), ('{"p": 2}')$$,
                  'the periodic run''s history row keeps its result too');

-- finish_and_take(…, finished_result) ------------------------------------------------------------------------------
SELECT queue.enqueue('{}', 'res.ft'), queue.enqueue('{}', 'res.ft');
SELECT pg_temp.take('ft', 'res.ft');
SELECT is((SELECT bool_and(f.finished) FROM took t, queue.finish_and_take(t.id, t.lease, 'res.ft', finished_result => '{"done": 1}') f
            WHERE t.name = 'ft'), true, 'finish_and_take with finished_result');
SELECT results_eq($$SELECT * FROM pg_temp.hist('ft')$$, $$VALUES ('res.ft', 'done', '{"done": 1}'::jsonb)$$,
                  'finish_and_take keeps the finished task''s result');

SELECT * FROM finish();
ROLLBACK;
