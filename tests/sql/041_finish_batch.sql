-- finish_batch(id[], lease[]): finishes every pair whose lease is current, skips the others,
-- returns how many attempts it ended; rejects malformed arrays; re-run tasks go back to ready.
BEGIN;
SELECT plan(28);

CREATE TEMP TABLE made (id bigint PRIMARY KEY);
CREATE TEMP TABLE took (id bigint PRIMARY KEY, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);

INSERT INTO made SELECT queue.enqueue_batch(ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 4}', '{"n": 5}']::jsonb[], 'fb');
INSERT INTO took SELECT * FROM queue.take_next('fb', batch => 5, worker => 'w-fb');
-- The pairs handed in: the three lowest ids with their leases (to finish), the fourth with a lease
-- that is not its own, and an id no task has; the fifth task is left out.
CREATE TEMP TABLE batch AS
SELECT array_agg(p.id ORDER BY p.ord) AS ids, array_agg(p.lease ORDER BY p.ord) AS leases
  FROM (SELECT row_number() OVER (ORDER BY t.id) AS ord, t.id,
               CASE WHEN row_number() OVER (ORDER BY t.id) <= 3 THEN t.lease ELSE gen_random_uuid() END AS lease
          FROM took t
         WHERE t.id < (SELECT max(id) FROM took)
        UNION ALL
        SELECT 99, -1, gen_random_uuid()) p;

SELECT is(queue.finish_batch(ids, leases), 3, 'finish_batch returns how many current pairs it finished')
  FROM batch;
SELECT is((SELECT count(*)::integer FROM queue.history
            WHERE id IN (SELECT id FROM took ORDER BY id LIMIT 3) AND status = 'done' AND worker = 'w-fb' AND attempt = 1),
          3, 'each finished pair has a done row in queue.history');
SELECT is_empty('SELECT 1 FROM queue.live_tasks WHERE id IN (SELECT id FROM took ORDER BY id LIMIT 3)',
                'the finished tasks left queue.live_tasks');
SELECT results_eq(
    'SELECT l.id, l.status::text, l.lease FROM queue.live_tasks l WHERE l.stage = ''fb'' ORDER BY l.id',
    'SELECT t.id, ''running'', t.lease FROM took t ORDER BY t.id OFFSET 3',
    'the task given a wrong lease and the task left out still run under their leases');
SELECT is_empty('SELECT 1 FROM queue.history WHERE id IN (SELECT id FROM took ORDER BY id OFFSET 3)',
                'the skipped tasks have no history row');

SELECT is(queue.finish_batch(ids, leases), 0, 'the same batch a second time finishes nothing')
  FROM batch;
SELECT is((SELECT count(*)::integer FROM queue.history WHERE id IN (SELECT id FROM took)), 3,
          'the second batch wrote no history rows');

-- Malformed arrays raise and change nothing.
SELECT throws_ok(format('SELECT queue.finish_batch(%L::bigint[], %L::uuid[])',
                        ARRAY[t.id, t.id], ARRAY[t.lease]),
                 '22023', 'id and lease must be arrays of the same length',
                 'arrays of different lengths raise 22023')
  FROM took t ORDER BY t.id DESC LIMIT 1;
SELECT throws_ok('SELECT queue.finish_batch(NULL, ARRAY[gen_random_uuid()])',
                 '22023', 'id and lease must be arrays of the same length',
                 'a NULL id array raises 22023');
SELECT throws_ok(format('SELECT queue.finish_batch(%L::bigint[], NULL)', ARRAY[t.id]),
                 '22023', 'id and lease must be arrays of the same length',
                 'a NULL lease array raises 22023')
  FROM took t ORDER BY t.id DESC LIMIT 1;
SELECT throws_ok('SELECT queue.finish_batch(NULL, NULL)',
                 '22023', 'id and lease must be arrays of the same length',
                 'two NULL arrays raise 22023');
-- A NULL pair would be skipped as stale, leaving its task running until reaped.
SELECT throws_ok(format('SELECT queue.finish_batch(%L::bigint[], %L::uuid[])',
                        ARRAY[t.id, NULL], ARRAY[t.lease, gen_random_uuid()]),
                 '22004', 'id and lease must not contain NULL',
                 'a NULL id in the array raises 22004 (nothing finished)')
  FROM took t ORDER BY t.id DESC LIMIT 1;
SELECT throws_ok(format('SELECT queue.finish_batch(%L::bigint[], ARRAY[%L::uuid, NULL])',
                        ARRAY[t.id, t.id + 1], t.lease),
                 '22004', 'id and lease must not contain NULL',
                 'a NULL lease in the array raises 22004 (nothing finished)')
  FROM took t ORDER BY t.id DESC LIMIT 1;
SELECT is(queue.finish_batch(ARRAY[[-1, -2]]::bigint[], ARRAY[[gen_random_uuid(), gen_random_uuid()]]), 0,
          'two-dimensional arrays of stale pairs are read element by element, as before (0 finished)');
SELECT throws_ok('SELECT queue.finish_batch(array_fill(-1::bigint, ARRAY[10001]), array_fill(gen_random_uuid(), ARRAY[10001]))',
                 '22023', 'batch out of range',
                 'more than 10000 pairs raise 22023');
SELECT results_eq(
    'SELECT l.id, l.status::text, l.lease FROM queue.live_tasks l WHERE l.stage = ''fb'' ORDER BY l.id',
    'SELECT t.id, ''running'', t.lease FROM took t ORDER BY t.id OFFSET 3',
    'after the raising calls the running tasks are unchanged');
SELECT is(queue.finish_batch(array_fill(-1::bigint, ARRAY[10000]), array_fill(gen_random_uuid(), ARRAY[10000])), 0,
          '10000 pairs are accepted (none current: 0)');

SELECT is(queue.finish_batch('{}'::bigint[], '{}'::uuid[]), 0, 'empty arrays finish nothing and return 0');

-- The last task, alone in a batch with its lease.
SELECT is(queue.finish_batch(ARRAY[t.id], ARRAY[t.lease]), 1, 'a batch of one current pair returns 1')
  FROM took t ORDER BY t.id DESC LIMIT 1;

-- Re-run tasks in a batch go back to ready; the others are done.
INSERT INTO made VALUES (queue.enqueue('{"v": 1}', 'fb.r', key => 'r-1'));
INSERT INTO made VALUES (queue.enqueue('{"v": 1}', 'fb.r', key => 'r-2'));
CREATE TEMP TABLE took_r AS SELECT * FROM queue.take_next('fb.r', batch => 2);
SELECT is(queue.enqueue('{"v": 2}', 'fb.r', key => 'r-1', mode => 'rerun'), t.id,
          'a rerun enqueue of a running task returns its id')
  FROM took_r t WHERE t.key = 'r-1';
SELECT is(queue.finish_batch(array_agg(t.id ORDER BY t.id), array_agg(t.lease ORDER BY t.id)), 2,
          'a batch with a re-run task counts it among the attempts it ended')
  FROM took_r t;
SELECT results_eq(
    'SELECT l.status::text, l.attempt, l.payload, l.lease, l.rerun FROM queue.live_tasks l
      WHERE l.id = (SELECT id FROM took_r WHERE key = ''r-1'')',
    $$VALUES ('ready', 0, '{"v": 2}'::jsonb, NULL::uuid, false)$$,
    'the re-run task is ready again at attempt 0 with the new payload');
SELECT is_empty('SELECT 1 FROM queue.history WHERE id = (SELECT id FROM took_r WHERE key = ''r-1'')',
                'the re-run task has no done row');
SELECT results_eq(
    'SELECT h.status::text, h.payload FROM queue.history h WHERE h.id = (SELECT id FROM took_r WHERE key = ''r-2'')',
    $$VALUES ('done', '{"v": 1}'::jsonb)$$,
    'the other task of the batch is done');
SELECT is(queue.finish_batch(array_agg(t.id ORDER BY t.id), array_agg(t.lease ORDER BY t.id)), 0,
          'the same re-run batch a second time ends nothing')
  FROM took_r t;

-- A pair given twice counts once.
INSERT INTO made VALUES (queue.enqueue('{"n": 6}', 'fb.d'));
CREATE TEMP TABLE took_d AS SELECT * FROM queue.take_next('fb.d');
SELECT is(queue.finish_batch(ARRAY[t.id, t.id], ARRAY[t.lease, t.lease]), 1, 'a pair given twice is finished once')
  FROM took_d t;

-- The group_key is copied into the done rows.
INSERT INTO made SELECT queue.enqueue_batch(ARRAY['{}', '{}']::jsonb[], 'fb.g', group_key => 'tenant-fb');
SELECT is(queue.finish_batch(array_agg(k.id), array_agg(k.lease)), 2, 'setup: a batch of two grouped tasks finishes')
  FROM queue.take_next('fb.g', batch => 2) k;
SELECT results_eq(
    $$SELECT h.status::text, h.group_key, count(*)::integer FROM queue.history h WHERE h.stage = 'fb.g' GROUP BY 1, 2$$,
    $$VALUES ('done', 'tenant-fb', 2)$$,
    'finish_batch writes the tasks'' group_key into their done rows');

SELECT * FROM finish();
ROLLBACK;
