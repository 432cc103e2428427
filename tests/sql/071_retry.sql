-- retry(id): a failed task (error, fatal, cancelled) is ready again now from attempt 0, same id
-- and payload; running and done tasks, unknown ids and taken keys raise, changing nothing.
BEGIN;
SELECT plan(40);

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);

INSERT INTO made VALUES ('error', queue.enqueue('{"n": 1}', 'rt.error'));
INSERT INTO made VALUES ('fatal', queue.enqueue('{"n": 2}', 'rt.fatal', priority => 7, key => 'f-1'));
INSERT INTO made VALUES ('cancelled', queue.enqueue('{"n": 3}', 'rt.cancelled'));
INSERT INTO made VALUES ('running', queue.enqueue('{"n": 4}', 'rt.running'));
INSERT INTO made VALUES ('done', queue.enqueue('{"n": 5}', 'rt.done'));
INSERT INTO made VALUES ('ready', queue.enqueue('{"n": 6}', 'rt.ready', run_at => now() + interval '1 hour'));
INSERT INTO took SELECT 'error', k.* FROM queue.take_next('rt.error') k;
SELECT is(queue.fail(id, lease, 'timeout'), true, 'the error task failed with a retry scheduled') FROM took WHERE name = 'error';
INSERT INTO took SELECT 'fatal', k.* FROM queue.take_next('rt.fatal', worker => 'w-f') k;
SELECT is(queue.fail(id, lease, 'bad input', fatal => true), true, 'the fatal task failed for good') FROM took WHERE name = 'fatal';
INSERT INTO took SELECT 'running', k.* FROM queue.take_next('rt.running') k;
INSERT INTO took SELECT 'done', k.* FROM queue.take_next('rt.done') k;
SELECT is(queue.finish(id, lease), true, 'the done task finished') FROM took WHERE name = 'done';
SELECT lives_ok(format('SELECT queue.cancel(%s)', id), 'the cancelled task was cancelled') FROM made WHERE name = 'cancelled';

-- An error task waiting for its retry.
SELECT lives_ok(format('SELECT queue.retry(%s)', id), 'retry of an error task succeeds') FROM made WHERE name = 'error';
SELECT results_eq(
    'SELECT status::text, run_at, attempt, payload FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''error'')',
    $$VALUES ('ready', now(), 0, '{"n": 1}'::jsonb)$$,
    'a retried error task is ready now at attempt 0');
SELECT results_eq('SELECT id, attempt FROM queue.take_next(''rt.error'')', 'SELECT id, 1 FROM made WHERE name = ''error''',
                  'the retried error task is taken at once, as attempt 1');

-- A fatal task comes back from history.
SELECT lives_ok(format('SELECT queue.retry(%s)', id), 'retry of a fatal task succeeds') FROM made WHERE name = 'fatal';
SELECT results_eq(
    'SELECT stage, status::text, run_at, attempt, priority, payload, key, lease FROM queue.live_tasks
      WHERE id = (SELECT id FROM made WHERE name = ''fatal'')',
    $$VALUES ('rt.fatal', 'ready', now(), 0, 7, '{"n": 2}'::jsonb, 'f-1', NULL::uuid)$$,
    'a retried fatal task is live again: same id, stage, priority, payload and key, ready now at attempt 0');
SELECT is_empty('SELECT 1 FROM queue.history WHERE id = (SELECT id FROM made WHERE name = ''fatal'')',
                'the history row of a retried fatal task is gone');
SELECT results_eq('SELECT id, attempt FROM queue.take_next(''rt.fatal'')', 'SELECT id, 1 FROM made WHERE name = ''fatal''',
                  'the retried fatal task is taken at once, as attempt 1');

-- A cancelled task likewise.
SELECT lives_ok(format('SELECT queue.retry(%s)', id), 'retry of a cancelled task succeeds') FROM made WHERE name = 'cancelled';
SELECT results_eq(
    'SELECT stage, status::text, run_at, attempt, payload FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''cancelled'')',
    $$VALUES ('rt.cancelled', 'ready', now(), 0, '{"n": 3}'::jsonb)$$,
    'a retried cancelled task is live again, ready now at attempt 0 with its payload');
SELECT is_empty('SELECT 1 FROM queue.history WHERE id = (SELECT id FROM made WHERE name = ''cancelled'')',
                'the history row of a retried cancelled task is gone');

-- A ready task is left as it is.
SELECT lives_ok(format('SELECT queue.retry(%s)', id), 'retry of a ready task succeeds') FROM made WHERE name = 'ready';
SELECT results_eq(
    'SELECT status::text, run_at, attempt FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''ready'')',
    $$VALUES ('ready', now() + interval '1 hour', 0)$$,
    'retry leaves a ready task and its planned time as they were');

-- Running, done and unknown tasks raise.
SELECT throws_ok(format('SELECT queue.retry(%s)', id), '55000', format('cannot retry task %s: it is running', id),
                 'retry of a running task raises 55000')
  FROM made WHERE name = 'running';
SELECT results_eq('SELECT status::text, attempt, lease FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''running'')',
                  'SELECT ''running'', 1, lease FROM took WHERE name = ''running''',
                  'the running task still runs under its lease');
SELECT throws_ok(format('SELECT queue.retry(%s)', id), '55000', format('cannot retry task %s: it is done', id),
                 'retry of a done task raises 55000')
  FROM made WHERE name = 'done';
SELECT results_eq('SELECT status::text FROM queue.tasks WHERE id = (SELECT id FROM made WHERE name = ''done'')',
                  $$VALUES ('done')$$,
                  'the done task is still only done');
SELECT throws_ok('SELECT queue.retry(-1)', 'P0002', 'task -1 not found', 'retry of an unknown id raises P0002');
CREATE TEMP TABLE live_before AS SELECT id, status, run_at, attempt FROM queue.live_tasks;
SELECT throws_ok('SELECT queue.retry(NULL)', '22004', 'id must not be NULL', 'retry of a NULL id raises 22004');
SELECT results_eq('SELECT id, status, run_at, attempt FROM queue.live_tasks ORDER BY id',
                  'SELECT id, status, run_at, attempt FROM live_before ORDER BY id',
                  'retry of a NULL id changed no live task');

-- A fatal task whose key a new live task of its stage has taken.
INSERT INTO made VALUES ('fk', queue.enqueue('{"n": 7}', 'rt.key', key => 'shared'));
INSERT INTO took SELECT 'fk', k.* FROM queue.take_next('rt.key') k;
SELECT is(queue.fail(id, lease, 'bad input', fatal => true), true, 'the keyed task failed for good') FROM took WHERE name = 'fk';
INSERT INTO made VALUES ('newer', queue.enqueue('{"n": 8}', 'rt.key', key => 'shared'));
SELECT isnt((SELECT id FROM made WHERE name = 'newer'), (SELECT id FROM made WHERE name = 'fk'),
            'a new task took the key of the fatal one');
SELECT throws_ok(format('SELECT queue.retry(%s)', id), 'SK002', format('cannot retry task %s: its key is taken', id),
                 'retry of a fatal task whose key is taken raises SK002')
  FROM made WHERE name = 'fk';
SELECT results_eq('SELECT status::text, error_text FROM queue.history WHERE id = (SELECT id FROM made WHERE name = ''fk'')',
                  $$VALUES ('fatal', 'bad input')$$,
                  'after SK002 the fatal task is still in history');
SELECT results_eq('SELECT id, payload, status::text FROM queue.live_tasks WHERE stage = ''rt.key''',
                  $$SELECT id, '{"n": 8}'::jsonb, 'ready' FROM made WHERE name = 'newer'$$,
                  'after SK002 the only live task of the key is the new one, unchanged');

-- A periodic task whose run finished and which was cancelled in the same transaction: both
-- history rows carry the same finished time; the cancel is the task's last event.
INSERT INTO made VALUES ('tie', queue.enqueue('{"n": 9}', 'rt.tie', repeat => '1 hour'));
INSERT INTO took SELECT 'tie', k.* FROM queue.take_next('rt.tie') k;
SELECT is(queue.finish(id, lease), true, 'a run of the periodic task finished') FROM took WHERE name = 'tie';
SELECT queue.cancel(id) FROM made WHERE name = 'tie';
SELECT results_eq(format('SELECT count(DISTINCT finished)::int, array_agg(status::text ORDER BY status::text) FROM queue.history WHERE id = %s', id),
                  $$VALUES (1, ARRAY['cancelled', 'done'])$$,
                  'its done run and its cancel share one finished time')
  FROM made WHERE name = 'tie';
SELECT lives_ok(format('SELECT queue.retry(%s)', id), 'retry takes the cancel, not the done run, as the last event')
  FROM made WHERE name = 'tie';

-- A periodic task whose run failed for good (recorded, the task re-armed) and which was then
-- cancelled, in one transaction: two rows other than done share a finished time; the cancel is
-- the last event, so retry revives the task from it and the fatal run stays in history.
INSERT INTO made VALUES ('tie2', queue.enqueue('{"n": 10}', 'rt.tie2', repeat => '1 hour'));
INSERT INTO took SELECT 'tie2', k.* FROM queue.take_next('rt.tie2') k;
SELECT is(queue.fail(id, lease, 'boom', fatal => true), true, 'a run of the periodic task failed for good') FROM took WHERE name = 'tie2';
SELECT queue.cancel(id) FROM made WHERE name = 'tie2';
SELECT results_eq(format('SELECT count(DISTINCT finished)::int, array_agg(status::text ORDER BY status::text) FROM queue.history WHERE id = %s', id),
                  $$VALUES (1, ARRAY['cancelled', 'fatal'])$$,
                  'setup: its fatal run and its cancel share one finished time')
  FROM made WHERE name = 'tie2';
SELECT throws_ok(format('SELECT queue.cancel(%s)', id), '55000', format('cannot cancel task %s: it is cancelled', id),
                 'a second cancel reports the task as cancelled, its last event, not fatal')
  FROM made WHERE name = 'tie2';
SELECT lives_ok(format('SELECT queue.retry(%s)', id), 'retry of the cancelled task') FROM made WHERE name = 'tie2';
SELECT results_eq(format($q$SELECT status::text, error_text FROM queue.tasks WHERE id = %s ORDER BY status::text$q$, id),
                  $$VALUES ('fatal'::text, 'boom'::text), ('ready', NULL)$$,
                  'retry took the cancel as the last event: the task is ready, its fatal run stays in history, no cancelled row is left')
  FROM made WHERE name = 'tie2';

-- Two fatal rows of one instant: a periodic run failed for good (the task re-armed), then the task,
-- made a one-off here as superuser, failed for good again in the same transaction. retry revives
-- the task from one row and deletes that one only.
INSERT INTO made VALUES ('fatal2', queue.enqueue('{"n": 11}', 'rt.fatal2', repeat => '1 hour'));
INSERT INTO took SELECT 'fatal2a', k.* FROM queue.take_next('rt.fatal2') k;
SELECT is(queue.fail(id, lease, 'boom', fatal => true), true, 'setup: a periodic run fails for good') FROM took WHERE name = 'fatal2a';
UPDATE queue.live_tasks t SET repeat = NULL, slot = NULL, run_at = now() WHERE t.id = (SELECT id FROM made WHERE name = 'fatal2');
INSERT INTO took SELECT 'fatal2b', k.* FROM queue.take_next('rt.fatal2') k;
SELECT is(queue.fail(id, lease, 'boom', fatal => true), true, 'setup: the task, now a one-off, fails for good') FROM took WHERE name = 'fatal2b';
SELECT lives_ok(format('SELECT queue.retry(%s)', id), 'retry of the task with two fatal rows of one instant') FROM made WHERE name = 'fatal2';
SELECT results_eq(format($q$SELECT h.status::text, (SELECT t.status::text FROM queue.live_tasks t WHERE t.id = h.id) FROM queue.history h WHERE h.id = %s$q$, id),
                  $$VALUES ('fatal'::text, 'ready'::text)$$,
                  'one fatal row stays in history (retry deleted the row it revived, not both) and the task is ready')
  FROM made WHERE name = 'fatal2';

SELECT * FROM finish();
ROLLBACK;
