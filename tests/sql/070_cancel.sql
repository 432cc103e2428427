-- cancel(id): a live task (ready, error, running) moves to queue.history as cancelled; the worker
-- running it loses its lease; unknown and finished tasks raise.
BEGIN;
SELECT plan(25);

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);

INSERT INTO made VALUES ('ready', queue.enqueue('{"n": 1}', 'cx.ready', priority => 4, key => 'k-1'));
INSERT INTO made VALUES ('error', queue.enqueue('{"n": 2}', 'cx.error'));
INSERT INTO made VALUES ('running', queue.enqueue('{"n": 3}', 'cx.running'));
INSERT INTO made VALUES ('done', queue.enqueue('{"n": 4}', 'cx.done'));
INSERT INTO took SELECT 'error', k.* FROM queue.take_next('cx.error', worker => 'w-err') k;
SELECT is(queue.fail(id, lease, 'timeout'), true, 'the error task failed its first attempt') FROM took WHERE name = 'error';
INSERT INTO took SELECT 'running', k.* FROM queue.take_next('cx.running', worker => 'w-run') k;
INSERT INTO took SELECT 'done', k.* FROM queue.take_next('cx.done') k;
SELECT is(queue.finish(id, lease), true, 'the done task finished') FROM took WHERE name = 'done';

-- A ready task.
SELECT lives_ok(format('SELECT queue.cancel(%s)', id), 'cancel of a ready task succeeds') FROM made WHERE name = 'ready';
SELECT is_empty('SELECT 1 FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''ready'')',
                'a cancelled ready task leaves queue.live_tasks');
SELECT results_eq(
    'SELECT status::text, stage, attempt, priority, payload, key, finished FROM queue.history WHERE id = (SELECT id FROM made WHERE name = ''ready'')',
    $$VALUES ('cancelled', 'cx.ready', 0, 4, '{"n": 1}'::jsonb, 'k-1', now())$$,
    'a cancelled ready task is one cancelled row in queue.history, its data kept');
SELECT is(queue.enqueue('{"n": 5}', 'cx.ready', key => 'k-1') <> id, true,
          'the key of a cancelled task is free for a new live task')
  FROM made WHERE name = 'ready';

-- A task waiting for its retry.
SELECT lives_ok(format('SELECT queue.cancel(%s)', id), 'cancel of an error task succeeds') FROM made WHERE name = 'error';
SELECT is_empty('SELECT 1 FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''error'')',
                'a cancelled error task leaves queue.live_tasks');
SELECT results_eq(
    'SELECT status::text, attempt, error_text, worker, started FROM queue.history WHERE id = (SELECT id FROM made WHERE name = ''error'')',
    $$VALUES ('cancelled', 1, 'timeout', 'w-err', NULL::timestamptz)$$,
    'a cancelled error task is cancelled in queue.history with its attempt and last error, and no start (its wait is no run time)');

-- A running task: the worker loses its lease.
SELECT lives_ok(format('SELECT queue.cancel(%s)', id), 'cancel of a running task succeeds') FROM made WHERE name = 'running';
SELECT results_eq(
    'SELECT status::text, attempt, worker, started FROM queue.history WHERE id = (SELECT id FROM made WHERE name = ''running'')',
    $$VALUES ('cancelled', 1, 'w-run', now())$$,
    'a cancelled running task is cancelled in queue.history with its attempt, worker and start');
SELECT is(queue.finish(id, lease), false, 'the worker''s finish after cancel returns false') FROM took WHERE name = 'running';
SELECT is(queue.fail(id, lease, 'late'), false, 'the worker''s fail after cancel returns false') FROM took WHERE name = 'running';
SELECT throws_ok(format('SELECT queue.heartbeat(%s, %L)', id, lease), 'SK001', 'lease lost',
                 'the worker''s heartbeat after cancel raises SK001')
  FROM took WHERE name = 'running';
SELECT results_eq(
    'SELECT status::text FROM queue.tasks WHERE id = (SELECT id FROM made WHERE name = ''running'')',
    $$VALUES ('cancelled')$$,
    'the late finish and fail left only the cancelled row');

-- Unknown and finished tasks.
SELECT throws_ok('SELECT queue.cancel(-1)', 'P0002', 'task -1 not found', 'cancel of an unknown id raises P0002');
SELECT throws_ok(format('SELECT queue.cancel(%s)', id), '55000', format('cannot cancel task %s: it is done', id),
                 'cancel of a done task raises 55000')
  FROM made WHERE name = 'done';
SELECT results_eq(
    'SELECT status::text FROM queue.history WHERE id = (SELECT id FROM made WHERE name = ''done'')',
    $$VALUES ('done')$$,
    'the done task stays done, with one history row');
SELECT throws_ok(format('SELECT queue.cancel(%s)', id), '55000', format('cannot cancel task %s: it is cancelled', id),
                 'cancel of a cancelled task raises 55000')
  FROM made WHERE name = 'running';
SELECT is((SELECT count(*)::integer FROM queue.history WHERE id = (SELECT id FROM made WHERE name = 'running')), 1,
          'cancelling twice writes no second history row');

-- NULL id: a caller's mistake, not an unknown task; raises like finish and fail do, changes nothing.
CREATE TEMP TABLE live_before AS SELECT id, status FROM queue.live_tasks;
SELECT throws_ok('SELECT queue.cancel(NULL)', '22004', 'id must not be NULL', 'cancel of a NULL id raises 22004');
SELECT results_eq('SELECT id, status FROM queue.live_tasks ORDER BY id', 'SELECT id, status FROM live_before ORDER BY id',
                  'cancel of a NULL id changed no live task');

-- A task moved on through a pipeline: cancel ends its live row, its done row stays.
INSERT INTO made VALUES ('pipe', queue.enqueue('{"n": 6}', 'cx.p1'));
INSERT INTO took SELECT 'pipe', k.* FROM queue.take_next('cx.p1') k;
SELECT is(queue.finish(id, lease, next_stage => 'cx.p2'), true, 'the pipeline task moved on to its next stage')
  FROM took WHERE name = 'pipe';
SELECT lives_ok(format('SELECT queue.cancel(%s)', id), 'cancel of a task that moved on succeeds') FROM made WHERE name = 'pipe';
SELECT results_eq(
    'SELECT stage, status::text FROM queue.tasks WHERE id = (SELECT id FROM made WHERE name = ''pipe'') ORDER BY stage',
    $$VALUES ('cx.p1', 'done'), ('cx.p2', 'cancelled')$$,
    'cancel ends the live stage of a pipeline task and keeps the done row of the first');

SELECT * FROM finish();
ROLLBACK;
