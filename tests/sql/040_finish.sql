-- finish(id, lease, next_stage): ends the attempt that holds the current lease, once; a stale,
-- wrong or earlier lease changes nothing; next_stage moves the task on (pipeline); a task
-- re-run while it ran is queued again instead of ending.
BEGIN;
SELECT plan(49);

-- Tasks enqueued and tasks taken in this file, by a name of our own.
CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);

-- Each scenario uses its own stage, so every take_next picks exactly the task meant.
INSERT INTO made VALUES ('a', queue.enqueue('{"n": 1}', 'fin.a'));
INSERT INTO took SELECT 'a', k.* FROM queue.take_next('fin.a', worker => 'w1') k;
-- now() does not move inside the test's transaction: as superuser, date created and started
-- back so that the history row shows they were copied, not set to the finish time.
UPDATE queue.live_tasks
   SET created = now() - interval '1 hour', started = now() - interval '1 minute'
 WHERE id = (SELECT id FROM took WHERE name = 'a');

-- The current lease ends the attempt.
SELECT is(queue.finish(id, lease), true, 'finish with the current lease returns true')
  FROM took WHERE name = 'a';
SELECT is_empty('SELECT 1 FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = ''a'')',
                'a finished task leaves queue.live_tasks');
SELECT results_eq(
    'SELECT status::text, stage, attempt, worker, payload, created, started, finished
       FROM queue.history WHERE id = (SELECT id FROM took WHERE name = ''a'')',
    $$VALUES ('done', 'fin.a', 1, 'w1', '{"n": 1}'::jsonb, now() - interval '1 hour',
              now() - interval '1 minute', now())$$,
    'one done row in queue.history keeps stage, attempt, worker, payload, created and started; finished is now');

-- Idempotent: the same lease a second time.
SELECT is(queue.finish(id, lease), false, 'a second finish with the same lease returns false')
  FROM took WHERE name = 'a';
SELECT is((SELECT count(*)::integer FROM queue.history WHERE id = (SELECT id FROM took WHERE name = 'a')), 1,
          'a second finish writes no second history row');
SELECT is_empty('SELECT 1 FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = ''a'')',
                'a second finish brings nothing back to queue.live_tasks');

-- A lease that was never the task's.
INSERT INTO made VALUES ('b', queue.enqueue('{"n": 2}', 'fin.b'));
INSERT INTO took SELECT 'b', k.* FROM queue.take_next('fin.b', worker => 'w2') k;
SELECT is(queue.finish(id, gen_random_uuid()), false, 'finish with a wrong lease returns false')
  FROM took WHERE name = 'b';
SELECT results_eq(
    'SELECT status::text, attempt, lease FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = ''b'')',
    'SELECT ''running'', 1, lease FROM took WHERE name = ''b''',
    'after a wrong lease the task still runs under its own lease');
SELECT is_empty('SELECT 1 FROM queue.history WHERE id = (SELECT id FROM took WHERE name = ''b'')',
                'a wrong lease writes no history row');

-- A lease from an earlier attempt: the task was reaped and taken again.
INSERT INTO made VALUES ('c', queue.enqueue('{"n": 3}', 'fin.c'));
INSERT INTO took SELECT 'c1', k.* FROM queue.take_next('fin.c', worker => 'w-dead') k;
-- As superuser: the lease runs out (now() does not move in this transaction) ...
UPDATE queue.live_tasks SET lease_expires = now() - interval '1 second'
 WHERE id = (SELECT id FROM took WHERE name = 'c1');
SELECT is(queue.reap_hung(), 1, 'the expired attempt is reaped');
-- ... and, still as superuser, the retry is made due now instead of after the backoff.
UPDATE queue.live_tasks SET run_at = now() WHERE id = (SELECT id FROM took WHERE name = 'c1');
INSERT INTO took SELECT 'c2', k.* FROM queue.take_next('fin.c', worker => 'w-alive') k;
SELECT is((SELECT attempt FROM took WHERE name = 'c2'), 2, 'the reaped task is taken again as attempt 2');
SELECT is(queue.finish(id, lease), false, 'finish with the lease of an earlier attempt returns false')
  FROM took WHERE name = 'c1';
SELECT results_eq(
    'SELECT status::text, attempt, lease, worker FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = ''c2'')',
    'SELECT ''running'', 2, lease, ''w-alive'' FROM took WHERE name = ''c2''',
    'the current attempt is untouched by the stale finish');
SELECT is_empty('SELECT 1 FROM queue.history WHERE id = (SELECT id FROM took WHERE name = ''c2'')',
                'the stale finish writes no history row');
SELECT is(queue.finish(id, lease), true, 'the current attempt can still finish')
  FROM took WHERE name = 'c2';

-- Arguments that are not usable raise, and change nothing.
SELECT throws_ok(format('SELECT queue.finish(NULL, %L)', lease), '22004', 'id and lease must not be NULL',
                 'finish with a NULL id raises 22004')
  FROM took WHERE name = 'b';
SELECT throws_ok(format('SELECT queue.finish(%s, NULL)', id), '22004', 'id and lease must not be NULL',
                 'finish with a NULL lease raises 22004')
  FROM took WHERE name = 'b';
SELECT throws_ok(format('SELECT queue.finish(%s, %L)', id, 'not-a-uuid'), '22P02',
                 'invalid input syntax for type uuid: "not-a-uuid"',
                 'finish with a lease that is not a UUID raises 22P02')
  FROM took WHERE name = 'b';
SELECT results_eq(
    'SELECT status::text, attempt, lease FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = ''b'')',
    'SELECT ''running'', 1, lease FROM took WHERE name = ''b''',
    'after the raising calls the task still runs under its lease');

-- Pipeline: done in this stage, ready in the next one, same id.
INSERT INTO made VALUES ('p', queue.enqueue('{"n": 4}', 'fin.p', priority => 3, key => 'p-4'));
INSERT INTO took SELECT 'p', k.* FROM queue.take_next('fin.p', worker => 'w-p') k;
SELECT is(queue.finish(id, lease, next_stage => 'publish'), true, 'finish with next_stage returns true')
  FROM took WHERE name = 'p';
SELECT results_eq(
    'SELECT status::text, stage, attempt, worker, payload FROM queue.history WHERE id = (SELECT id FROM took WHERE name = ''p'')',
    $$VALUES ('done', 'fin.p', 1, 'w-p', '{"n": 4}'::jsonb)$$,
    'finish with next_stage writes a done row for the stage just completed');
SELECT results_eq(
    'SELECT stage, status::text, attempt, run_at, lease, lease_expires, worker, started, priority, payload, key
       FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = ''p'')',
    $$VALUES ('publish', 'ready', 0, now(), NULL::uuid, NULL::timestamptz, NULL::text, NULL::timestamptz,
              3, '{"n": 4}'::jsonb, 'p-4')$$,
    'the same id waits in the next stage: ready, attempt 0, due now, no lease, no worker; priority, payload, key kept');
SELECT results_eq(
    'SELECT stage, status::text FROM queue.tasks WHERE id = (SELECT id FROM took WHERE name = ''p'') ORDER BY finished NULLS LAST',
    $$VALUES ('fin.p', 'done'), ('publish', 'ready')$$,
    'queue.tasks shows the finished row of the first stage and the live row of the next');
SELECT results_eq(
    'SELECT id, attempt FROM queue.take_next(''publish'')',
    'SELECT id, 1 FROM took WHERE name = ''p''',
    'take_next of the next stage takes the moved task as its attempt 1');
SELECT is(queue.finish(id, lease, next_stage => 'publish'), false,
          'the old lease cannot move the task again')
  FROM took WHERE name = 'p';

-- Pipeline into a stage where a live task has the same key.
INSERT INTO made VALUES ('k', queue.enqueue('{"n": 5}', 'fin.k', key => 'dup'));
INSERT INTO made VALUES ('publish-dup', queue.enqueue('{"other": true}', 'publish', key => 'dup'));
INSERT INTO took SELECT 'k', k.* FROM queue.take_next('fin.k', worker => 'w-k') k;
SELECT throws_ok(format('SELECT queue.finish(%s, %L, next_stage => %L)', id, lease, 'publish'),
                 'SK002', 'key already taken in the next stage',
                 'moving a task into a stage where a live task has its key raises SK002')
  FROM took WHERE name = 'k';
SELECT results_eq(
    'SELECT stage, status::text, attempt, lease FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = ''k'')',
    'SELECT ''fin.k'', ''running'', 1, lease FROM took WHERE name = ''k''',
    'after SK002 the task still runs in its stage under its lease');
SELECT is_empty('SELECT 1 FROM queue.history WHERE id = (SELECT id FROM took WHERE name = ''k'')',
                'after SK002 no done row was written');
SELECT results_eq(
    $$SELECT payload, status::text FROM queue.live_tasks WHERE stage = 'publish' AND key = 'dup'$$,
    $$VALUES ('{"other": true}'::jsonb, 'ready')$$,
    'after SK002 the task holding the key in the next stage is unchanged');

-- Invalid next_stage names.
SELECT throws_ok(format('SELECT queue.finish(%s, %L, next_stage => %L)', id, lease, ''),
                 '22023', 'invalid next_stage name', 'an empty next_stage raises 22023')
  FROM took WHERE name = 'k';
SELECT throws_ok(format('SELECT queue.finish(%s, %L, next_stage => %L)', id, lease, repeat('s', 55)),
                 '22023', 'invalid next_stage name', 'a next_stage of 55 bytes raises 22023')
  FROM took WHERE name = 'k';
SELECT throws_ok(format('SELECT queue.finish(%s, %L, next_stage => %L)', id, lease, '*'),
                 '22023', 'invalid next_stage name', 'next_stage ''*'' (the defaults row) raises 22023')
  FROM took WHERE name = 'k';
SELECT results_eq(
    'SELECT stage, status::text, lease FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = ''k'')',
    'SELECT ''fin.k'', ''running'', lease FROM took WHERE name = ''k''',
    'after an invalid next_stage the task still runs in its stage under its lease');
SELECT is(queue.finish(id, lease, next_stage => repeat('s', 54)), true, 'a next_stage of 54 bytes is accepted')
  FROM took WHERE name = 'k';
SELECT is((SELECT stage FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = 'k')), repeat('s', 54),
          'the task waits in the 54-byte stage');

-- Re-run: enqueued again with mode 'rerun' while it ran.
INSERT INTO made VALUES ('r', queue.enqueue('{"v": 1}', 'fin.r', key => 'r-1'));
INSERT INTO took SELECT 'r', k.* FROM queue.take_next('fin.r', worker => 'w-r') k;
SELECT is(queue.enqueue('{"v": 2}', 'fin.r', key => 'r-1', mode => 'rerun'), id,
          'a rerun enqueue of a running task returns its id')
  FROM took WHERE name = 'r';
SELECT is(queue.finish(id, lease), true, 'finish of a task re-run while it ran returns true')
  FROM took WHERE name = 'r';
SELECT results_eq(
    'SELECT status::text, attempt, payload, lease, lease_expires, rerun FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = ''r'')',
    $$VALUES ('ready', 0, '{"v": 2}'::jsonb, NULL::uuid, NULL::timestamptz, false)$$,
    'the re-run task is ready again at attempt 0 with the new payload and no lease');
SELECT is_empty('SELECT 1 FROM queue.history WHERE id = (SELECT id FROM took WHERE name = ''r'')',
                'the re-run task has no done row for the attempt it finished');
SELECT is(queue.finish(id, lease), false, 'the finished attempt''s lease no longer counts')
  FROM took WHERE name = 'r';

-- Re-run with next_stage: it runs again in its own stage, it does not move on.
INSERT INTO made VALUES ('rp', queue.enqueue('{"v": 1}', 'fin.rp', key => 'rp-1'));
INSERT INTO took SELECT 'rp', k.* FROM queue.take_next('fin.rp') k;
SELECT is(queue.enqueue('{"v": 2}', 'fin.rp', key => 'rp-1', mode => 'rerun'), id,
          'a rerun enqueue of a running task returns its id, whatever the next stage will be')
  FROM took WHERE name = 'rp';
SELECT is(queue.finish(id, lease, next_stage => 'publish'), true,
          'finish with next_stage of a re-run task returns true')
  FROM took WHERE name = 'rp';
SELECT results_eq(
    'SELECT stage, status::text, attempt, payload FROM queue.live_tasks WHERE id = (SELECT id FROM took WHERE name = ''rp'')',
    $$VALUES ('fin.rp', 'ready', 0, '{"v": 2}'::jsonb)$$,
    'a re-run task stays in its stage, ready at attempt 0 with the new payload');
SELECT is_empty('SELECT 1 FROM queue.history WHERE id = (SELECT id FROM took WHERE name = ''rp'')',
                'a re-run task moved on nowhere and has no done row');

-- Cancelled under the worker: its finish is a stale one.
INSERT INTO made VALUES ('x', queue.enqueue('{"n": 6}', 'fin.x'));
INSERT INTO took SELECT 'x', k.* FROM queue.take_next('fin.x') k;
SELECT queue.cancel(id) FROM took WHERE name = 'x';
SELECT is(queue.finish(id, lease), false, 'finish of a cancelled task returns false')
  FROM took WHERE name = 'x';
SELECT results_eq(
    'SELECT status::text FROM queue.history WHERE id = (SELECT id FROM took WHERE name = ''x'')',
    $$VALUES ('cancelled')$$,
    'finish of a cancelled task leaves its cancelled row alone');

-- The group_key goes with the task: into its done row, and on into the next stage.
INSERT INTO made VALUES ('g', queue.enqueue('{"n": 7}', 'fin.g', group_key => 'tenant-g'));
SELECT is(queue.finish(k.id, k.lease, next_stage => 'fin.g2'), true, 'a grouped task moves on to the next stage')
  FROM queue.take_next('fin.g') k;
SELECT is(queue.finish(k.id, k.lease), true, 'and finishes there') FROM queue.take_next('fin.g2') k;
SELECT results_eq(
    'SELECT stage, status::text, group_key FROM queue.history WHERE id = (SELECT id FROM made WHERE name = ''g'') ORDER BY stage',
    $$VALUES ('fin.g', 'done', 'tenant-g'), ('fin.g2', 'done', 'tenant-g')$$,
    'both done rows of a grouped task keep its group_key');

SELECT * FROM finish();
ROLLBACK;
