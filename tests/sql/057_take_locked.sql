-- take_locked / finish_locked / fail_locked: a claim that is the row lock of the caller's
-- transaction. The take writes nothing; only the transaction that holds a task's lock can end
-- it; what it ends goes where finish() and fail() send it. (Two transactions: tests/py/test_take_locked.py.)
BEGIN;
SELECT plan(66);

CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, payload jsonb, attempt integer, priority integer, key text);

-- Order as take_next: priority, then run_at, then id; nothing is written.
SELECT queue.enqueue('{"n": 1}', 'lk.a', priority => 2) AS a1 \gset
SELECT queue.enqueue('{"n": 2}', 'lk.a', priority => 1) AS a2 \gset
SELECT queue.enqueue('{"n": 3}', 'lk.a', priority => 1, key => 'k3') AS a3 \gset
SELECT queue.enqueue('{"n": 4}', 'lk.a', run_at => now() + interval '1 hour') AS a4 \gset
CREATE TEMP TABLE a_before AS SELECT * FROM queue.live_tasks WHERE stage = 'lk.a';
INSERT INTO took SELECT 'a' || row_number() OVER (), k.* FROM queue.take_locked('lk.a', 2) k;
SELECT results_eq('SELECT id, payload, attempt, priority, key FROM took ORDER BY name',
                  format('VALUES (%s::bigint, ''{"n": 2}''::jsonb, 1, 1, NULL::text), (%s, ''{"n": 3}'', 1, 1, ''k3'')', :a2, :a3),
                  'take_locked returns the due tasks in priority, run_at, id order, each with the attempt it runs as');
SELECT set_eq('SELECT * FROM queue.live_tasks WHERE stage = ''lk.a''', 'SELECT * FROM a_before',
              'take_locked writes nothing: status, attempt and lease stay as they were');
SELECT is((SELECT bool_and(t.xmax = xid(pg_current_xact_id())) FROM queue.live_tasks t JOIN took USING (id)), true,
          'the taken rows are locked by this transaction');
-- The session's claim position (skiplock.claim_hint) is the last task taken: a second take starts
-- there, and skips the tasks this transaction already holds (SKIP LOCKED alone would not).
SELECT results_eq($$SELECT id FROM queue.take_locked('lk.a', 5) ORDER BY id$$,
                  format('VALUES (%s::bigint)', :a1),
                  'a second take in the same transaction gets the next due task, none it holds already, no task not due');

-- finish_locked ends a task this transaction holds, once.
SELECT is(queue.finish_locked(:a2, worker => 'w1'), true, 'finish_locked of a task this transaction took returns true');
SELECT is_empty(format('SELECT 1 FROM queue.live_tasks WHERE id = %s', :a2), 'a finished task leaves queue.live_tasks');
SELECT results_eq(format('SELECT status::text, stage, attempt, worker, payload, started FROM queue.history WHERE id = %s', :a2),
                  $$VALUES ('done', 'lk.a', 1, 'w1', '{"n": 2}'::jsonb, now())$$,
                  'one done row in queue.history with the attempt it ran as, the worker, and the transaction''s start as started');
SELECT ok((SELECT finished >= now() FROM queue.history WHERE id = :a2), 'finished is the clock time of the finish');
SELECT is(queue.finish_locked(:a2), false, 'a second finish_locked returns false');
SELECT is((SELECT count(*)::integer FROM queue.history WHERE id = :a2), 1, 'a second finish_locked writes no second history row');
SELECT is_empty($$SELECT 1 FROM queue.take_locked('lk.a', 5) WHERE id = $$ || :a2,
                'a finished task is not taken again');

-- A task this transaction never took is not its to end.
SELECT queue.enqueue('{"n": 5}', 'lk.b') AS b1 \gset
SELECT is(queue.finish_locked(:b1), false, 'finish_locked of a task not taken returns false');
SELECT is(queue.fail_locked(:b1, 'boom'), false, 'fail_locked of a task not taken returns false');
SELECT results_eq(format('SELECT status::text, attempt FROM queue.live_tasks WHERE id = %s', :b1), $$VALUES ('ready', 0)$$,
                  'the task not taken is left ready at attempt 0');
SELECT is_empty(format('SELECT 1 FROM queue.history WHERE id = %s', :b1), 'and nothing is written to history for it');
-- A task taken by take_next has a lease: not this transaction's lock.
SELECT queue.enqueue('{"n": 6}', 'lk.c') AS c1 \gset
SELECT lease AS c1_lease FROM queue.take_next('lk.c') \gset
SELECT is(queue.finish_locked(:c1), false, 'finish_locked of a task taken with take_next returns false');
SELECT is(queue.finish(:c1, :'c1_lease'), true, 'the leased task still finishes with its lease');
-- A task taken inside a savepoint is the transaction's while the savepoint lives (it used to
-- raise 55000: the fence read the row's xmax, which then named the subtransaction). Rolling the
-- savepoint back undoes the take and whatever ended the task in it.
SAVEPOINT inner_take;
SELECT is((SELECT count(*)::integer FROM queue.take_locked('lk.b')), 1, 'take_locked inside a savepoint takes the task');
SELECT is(queue.finish_locked(:b1), true, 'finish_locked ends a task taken inside the open savepoint');
SELECT is(queue.fail_locked(:b1, 'x'), false, 'and fail_locked then finds it ended');
ROLLBACK TO SAVEPOINT inner_take;
RELEASE SAVEPOINT inner_take;
SELECT is(queue.finish_locked(:b1), false, 'once the savepoint is rolled back its take is gone: finish_locked returns false');
SELECT results_eq(format('SELECT status::text, attempt FROM queue.live_tasks WHERE id = %s', :b1), $$VALUES ('ready', 0)$$,
                  'and the task is back, ready, its attempt not counted');
-- The record cannot be forged: a setting that names the task without its signature ends nothing.
SELECT set_config('skiplock.held', format('%s:%s,', :b1, repeat('0', 32)), true) AS forged \gset
SELECT is(queue.finish_locked(:b1), false, 'finish_locked of a task named in a forged skiplock.held returns false');
SELECT is(queue.fail_locked(:b1, 'x'), false, 'fail_locked of a task named in a forged skiplock.held returns false');
SELECT set_config('skiplock.held', '', true) AS cleared \gset

-- fail_locked: retried with the attempt counted, then fatal at max_attempts.
SELECT queue.enqueue('{"n": 7}', 'lk.f') AS f1 \gset
DO $$ BEGIN PERFORM queue.configure_stage('lk.f', max_attempts => 2); END $$;
SELECT is((SELECT attempt FROM queue.take_locked('lk.f')), 1, 'the first take runs attempt 1');
SELECT is(queue.fail_locked(:f1, 'boom', retry_in => interval '10 minutes', worker => 'w2'), true, 'fail_locked returns true');
SELECT results_eq(format('SELECT status::text, attempt, error_text FROM queue.live_tasks WHERE id = %s', :f1),
                  $$VALUES ('error', 1, 'boom')$$, 'the failed task waits as error with its attempt counted');
SELECT ok((SELECT run_at > now() + interval '9 minutes' FROM queue.live_tasks WHERE id = :f1), 'it is retried after retry_in');
SELECT is(queue.finish_locked(:f1), false, 'a task failed in this transaction cannot be finished too');
SELECT is_empty($$SELECT 1 FROM queue.take_locked('lk.f')$$, 'a retry not due is not taken');
-- A retry runs in a later transaction. As superuser, stand in for an earlier transaction that
-- failed the task once (written with updated = now(), as by another transaction), due now.
SELECT queue.enqueue('{"n": 7}', 'lk.g') AS g1 \gset
DO $$ BEGIN PERFORM queue.configure_stage('lk.g', max_attempts => 2); END $$;
UPDATE queue.live_tasks SET status = 'error', attempt = 1, error_text = 'boom', updated = now() WHERE id = :g1;
SELECT is((SELECT attempt FROM queue.take_locked('lk.g')), 2, 'the retry runs attempt 2');
SELECT is(queue.fail_locked(:g1, repeat('x', 3000)), true, 'fail_locked of the last attempt returns true');
SELECT is_empty(format('SELECT 1 FROM queue.live_tasks WHERE id = %s', :g1), 'at max_attempts the task leaves queue.live_tasks');
SELECT results_eq(format('SELECT status::text, attempt, length(error_text) <= 2000 FROM queue.history WHERE id = %s', :g1),
                  $$VALUES ('fatal', 2, true)$$, 'it is recorded fatal at attempt 2, its error text bounded');
SELECT queue.enqueue('{"n": 8}', 'lk.f') AS f2 \gset
SELECT is((SELECT count(*)::integer FROM queue.take_locked('lk.f')), 1, 'a fresh task is taken');
SELECT is(queue.fail_locked(:f2, 'bad input', fatal => true), true, 'fail_locked(fatal => true) returns true');
SELECT results_eq(format('SELECT status::text, attempt, error_text FROM queue.history WHERE id = %s', :f2),
                  $$VALUES ('fatal', 1, 'bad input')$$, 'fatal => true ends the task at its first attempt');

-- A periodic task is recorded and re-armed.
SELECT queue.enqueue('{"n": 9}', 'lk.p', repeat => interval '1 hour') AS p1 \gset
-- As left by an earlier attempt through take_next that failed: the re-arm must clear them.
UPDATE queue.live_tasks SET worker = 'lease-worker', started = now() - interval '1 minute' WHERE id = :p1;
SELECT is((SELECT count(*)::integer FROM queue.take_locked('lk.p')), 1, 'a periodic task is taken');
SELECT is(queue.finish_locked(:p1), true, 'finish_locked of a periodic task returns true');
SELECT results_eq(format('SELECT status::text, attempt, run_at > now(), worker, started FROM queue.live_tasks WHERE id = %s', :p1),
                  $$VALUES ('ready', 0, true, NULL::text, NULL::timestamptz)$$,
                  'the periodic task is re-armed for its next run, with no worker or start of a past attempt');
SELECT queue.enqueue('{"n": 15}', 'lk.p2', repeat => interval '1 hour') AS p2 \gset
UPDATE queue.live_tasks SET worker = 'lease-worker', started = now() - interval '1 minute' WHERE id = :p2;
SELECT is((SELECT count(*)::integer FROM queue.take_locked('lk.p2')), 1, 'another periodic task is taken');
SELECT is(queue.fail_locked(:p2, 'bad', fatal => true), true, 'fail_locked(fatal) of a periodic task returns true');
SELECT results_eq(format('SELECT status::text, attempt, worker, started FROM queue.live_tasks WHERE id = %s', :p2),
                  $$VALUES ('ready', 0, NULL::text, NULL::timestamptz)$$,
                  'fail_locked re-arms it the same way');
SELECT is((SELECT status::text FROM queue.history WHERE id = :p1), 'done', 'its run is recorded done');

-- Stages it cannot serve, and bad arguments.
DO $$ BEGIN PERFORM queue.configure_stage('lk.max', max_running => 3); END $$;
SELECT throws_ok($$SELECT * FROM queue.take_locked('lk.max')$$, '0A000', 'stage ''lk.max'' has concurrency limits',
                 'a stage with max_running raises 0A000');
DO $$ BEGIN PERFORM queue.configure_stage('lk.grp', group_limit => 1); END $$;
SELECT throws_ok($$SELECT * FROM queue.take_locked('lk.grp')$$, '0A000', NULL, 'a stage with group_limit raises 0A000');
SELECT queue.enqueue('{"n": 10}', 'lk.paused') AS z1 \gset
DO $$ BEGIN PERFORM queue.configure_stage('lk.paused', paused => true); END $$;
SELECT is_empty($$SELECT 1 FROM queue.take_locked('lk.paused')$$, 'a paused stage hands out nothing');
SELECT is((SELECT count(*)::integer FROM queue.stage_waiters WHERE stage = 'lk.paused'), 0,
          'a paused stage is not marked as waited on');

-- Several takes in one transaction: SKIP LOCKED does not skip the transaction's own locks.
SELECT queue.enqueue('{"n": 13}', 'lk.twice') AS t1 \gset
SELECT queue.enqueue('{"n": 14}', 'lk.twice') AS t2 \gset
SELECT is((SELECT id FROM queue.take_locked('lk.twice')), :t1::bigint, 'the first take in a transaction gets the first task');
SELECT is((SELECT id FROM queue.take_locked('lk.twice')), :t2::bigint, 'a second take in the same transaction gets the next task, not the one it holds');
SELECT is_empty($$SELECT 1 FROM queue.take_locked('lk.twice', 5)$$, 'a third finds nothing: both tasks are this transaction''s');

-- Wake-ups: an empty take marks the stage, so that enqueues NOTIFY a worker that LISTENs.
SELECT is_empty($$SELECT 1 FROM queue.take_locked('lk.wait')$$, 'an empty stage hands out nothing');
SELECT ok((SELECT until > now() + interval '50 seconds' FROM queue.stage_waiters WHERE stage = 'lk.wait'),
          'a take_locked that finds nothing due marks the stage as waited on for a minute');
SELECT queue.enqueue('{"n": 12}', 'lk.busy') AS w1 \gset
SELECT is((SELECT count(*)::integer FROM queue.take_locked('lk.busy')), 1, 'a task is taken');
SELECT is((SELECT count(*)::integer FROM queue.stage_waiters WHERE stage = 'lk.busy'), 0,
          'a take_locked that claims does not mark the stage');
SELECT throws_ok($$SELECT * FROM queue.take_locked('lk.a', 0)$$, '22023', 'batch out of range', 'batch 0 is 22023');
SELECT throws_ok($$SELECT * FROM queue.take_locked('lk.a', NULL)$$, '22023', NULL, 'a NULL batch is 22023');
SELECT throws_ok($$SELECT * FROM queue.take_locked(NULL)$$, '22004', NULL, 'a NULL stage is 22004');
SELECT throws_ok($$SELECT queue.finish_locked(NULL)$$, '22004', NULL, 'finish_locked of a NULL id is 22004');
SELECT throws_ok($$SELECT queue.finish_locked(1, repeat('w', 201))$$, '22023', 'worker name too long', 'finish_locked: a worker name over 200 characters is 22023');
SELECT throws_ok($$SELECT queue.fail_locked(NULL, 'x')$$, '22004', NULL, 'fail_locked of a NULL id is 22004');
SELECT throws_ok($$SELECT queue.fail_locked(1, 'x', fatal => NULL)$$, '22004', 'fatal must not be NULL',
                 'fail_locked with fatal NULL is 22004, not a silent retry');
SELECT throws_ok($$SELECT queue.fail_locked(1, 'x', retry_in => interval '-1 second')$$, '22023', 'retry_in must not be negative',
                 'fail_locked: a negative retry_in is 22023');

-- A restricted stage admits only the roles it lists.
CREATE ROLE skiplock_t_locked_worker NOLOGIN IN ROLE skiplock_worker;
SELECT queue.enqueue('{"n": 11}', 'lk.r') AS r1 \gset
SELECT lives_ok($$SELECT queue.grant_stage('lk.r', 'skiplock_admin')$$, 'lk.r is restricted to admins');
SET ROLE skiplock_t_locked_worker;
SELECT throws_ok($$SELECT * FROM queue.take_locked('lk.r')$$, '42501', 'permission denied for stage lk.r',
                 'a worker without the take right on a restricted stage gets 42501');
SELECT throws_ok('SELECT key FROM queue.fence_key', '42501', NULL, 'a worker cannot read the key that signs skiplock.held');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
