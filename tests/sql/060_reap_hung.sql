-- reap_hung(): running tasks whose lease expired go back to error (retry per backoff) or, out of
-- attempts, to fatal; tasks with a live lease are left alone; the old lease is dead afterwards.
BEGIN;
SELECT plan(23);

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);
CREATE TEMP TABLE policy AS SELECT NULL::queue.stage_settings AS s WITH NO DATA;

-- e: will expire; n: keeps a live lease; l: on its last attempt; r: re-run while it runs.
INSERT INTO policy SELECT queue.configure_stage('rh.last', max_attempts => 1);
INSERT INTO made VALUES ('e', queue.enqueue('{"n": 1}', 'rh.e'));
INSERT INTO made VALUES ('n', queue.enqueue('{"n": 2}', 'rh.n'));
INSERT INTO made VALUES ('l', queue.enqueue('{"n": 3}', 'rh.last'));
INSERT INTO made VALUES ('r', queue.enqueue('{"v": 1}', 'rh.r', key => 'r-1'));
INSERT INTO took SELECT 'e', k.* FROM queue.take_next('rh.e', worker => 'w-e') k;
INSERT INTO took SELECT 'n', k.* FROM queue.take_next('rh.n', worker => 'w-n') k;
INSERT INTO took SELECT 'l', k.* FROM queue.take_next('rh.last', worker => 'w-l') k;
INSERT INTO took SELECT 'r', k.* FROM queue.take_next('rh.r', worker => 'w-r') k;

SELECT is(queue.reap_hung(), 0, 'reap_hung returns 0 when no lease has expired');
SELECT is((SELECT count(*)::integer FROM queue.live_tasks WHERE status = 'running' AND stage LIKE 'rh.%'), 4,
          'reap_hung with nothing expired leaves every running task running');

SELECT is(queue.enqueue('{"v": 2}', 'rh.r', key => 'r-1', mode => 'rerun'), id,
          'a rerun enqueue of a running task returns its id')
  FROM made WHERE name = 'r';
-- now() does not move in this transaction: as superuser, let three leases run out.
UPDATE queue.live_tasks SET lease_expires = now() - interval '1 second'
 WHERE id IN (SELECT id FROM made WHERE name IN ('e', 'l', 'r'));

SELECT is(queue.reap_hung(), 3, 'reap_hung returns how many expired tasks it recovered');

SELECT results_eq(
    'SELECT status::text, attempt, lease, lease_expires, payload FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''e'')',
    $$VALUES ('error', 1, NULL::uuid, NULL::timestamptz, '{"n": 1}'::jsonb)$$,
    'an expired task becomes error, keeps its attempt, loses its lease');
SELECT ok((SELECT error_text LIKE 'lease expired%' FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'e')),
          'the error text of a reaped task starts with lease expired');
SELECT ok((SELECT error_text LIKE '%w-e%' FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'e')),
          'the error text names the worker that held the lease');
SELECT ok((SELECT run_at > now() FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'e')),
          'a reaped task is retried later, per the backoff');
SELECT is_empty('SELECT 1 FROM queue.take_next(''rh.e'')', 'a reaped task is not taken before its retry is due');

SELECT results_eq(
    'SELECT status::text, attempt, lease, worker FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''n'')',
    'SELECT ''running'', 1, lease, ''w-n'' FROM took WHERE name = ''n''',
    'a task whose lease has not expired is untouched');

SELECT is_empty('SELECT 1 FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''l'')',
                'an expired task on its last attempt leaves queue.live_tasks');
SELECT results_eq(
    'SELECT status::text, attempt, worker, finished, error_text LIKE ''lease expired%'' FROM queue.history
      WHERE id = (SELECT id FROM made WHERE name = ''l'')',
    $$VALUES ('fatal', 1, 'w-l', now(), true)$$,
    'an expired task on its last attempt is fatal in queue.history, with the lease expired error');

SELECT results_eq(
    'SELECT status::text, attempt, payload, lease, rerun, run_at, error_text FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''r'')',
    $$VALUES ('ready', 0, '{"v": 2}'::jsonb, NULL::uuid, false, now(), NULL::text)$$,
    'an expired task re-run while it ran is ready again from attempt 0 with the new payload, with no error');

-- The old leases are dead.
SELECT is(queue.finish(id, lease), false, 'after reaping, finish with the old lease returns false')
  FROM took WHERE name = 'e';
SELECT is(queue.fail(id, lease, 'late'), false, 'after reaping, fail with the old lease returns false')
  FROM took WHERE name = 'e';
SELECT throws_ok(format('SELECT queue.heartbeat(%s, %L)', id, lease), 'SK001', 'lease lost',
                 'after reaping, heartbeat with the old lease raises SK001')
  FROM took WHERE name = 'e';
SELECT is(queue.finish(id, lease), false, 'after reaping, finish of the fatal task with its old lease returns false')
  FROM took WHERE name = 'l';
SELECT is((SELECT count(*)::integer FROM queue.history WHERE id = (SELECT id FROM made WHERE name = 'l')), 1,
          'the late finish added no row to the fatal task''s history');
SELECT ok((SELECT status = 'error' AND error_text LIKE 'lease expired%' FROM queue.live_tasks
            WHERE id = (SELECT id FROM made WHERE name = 'e')),
          'the late finish and fail left the reaped task as it was');

SELECT is(queue.reap_hung(), 0, 'a second reap_hung finds nothing more');
SELECT is(queue.finish(id, lease), true, 'the task whose lease never expired still finishes')
  FROM took WHERE name = 'n';

-- A reaped task that becomes fatal keeps its group_key.
INSERT INTO made VALUES ('g', queue.enqueue('{}', 'rh.last', group_key => 'tenant-rh'));
INSERT INTO took SELECT 'g', k.* FROM queue.take_next('rh.last') k;
UPDATE queue.live_tasks SET lease_expires = now() - interval '1 second' WHERE id = (SELECT id FROM made WHERE name = 'g');  -- as superuser
SELECT is(queue.reap_hung(), 1, 'setup: the grouped task on its last attempt is reaped');
SELECT results_eq(
    $$SELECT h.status::text, h.group_key FROM queue.history h WHERE h.id = (SELECT id FROM made WHERE name = 'g')$$,
    $$VALUES ('fatal', 'tenant-rh')$$,
    'reap_hung writes a fatal row with the task''s group_key');

SELECT * FROM finish();
ROLLBACK;
