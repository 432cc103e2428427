-- release(id, lease, retry_in): hands a running task back without counting the attempt; a stale
-- lease changes nothing; a retry stays a retry; a re-run starts over; shutdowns never use up
-- attempts; with retry_in (a snooze) the task is due that long from now.
BEGIN;
SELECT plan(25);

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);

SELECT throws_ok('SELECT queue.release(NULL, gen_random_uuid())', '22004', 'id and lease must not be NULL',
                 'release with a NULL id raises 22004');
SELECT throws_ok('SELECT queue.release(1, NULL)', '22004', 'id and lease must not be NULL',
                 'release with a NULL lease raises 22004');

-- A plain task: released, it is ready again in its place, the attempt not counted.
INSERT INTO made VALUES ('a', queue.enqueue('{"n": 1}', 'rl.a', priority => 3));
CREATE TEMP TABLE before_a AS SELECT run_at, priority FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'a');
INSERT INTO took SELECT 'a', k.* FROM queue.take_next('rl.a', worker => 'w-a') k;
SELECT is(queue.release(id, gen_random_uuid()), false, 'release with a stranger lease returns false')
  FROM took WHERE name = 'a';
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'a')), 'running',
          'a stranger lease leaves the task running');
SELECT is(queue.release(id, lease), true, 'release with the current lease returns true') FROM took WHERE name = 'a';
SELECT results_eq(
    'SELECT status::text, attempt, lease, lease_expires, started, worker, run_at, priority FROM queue.live_tasks
      WHERE id = (SELECT id FROM made WHERE name = ''a'')',
    'SELECT ''ready''::text, 0, NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::text, run_at, priority FROM before_a',
    'a released task is ready, attempt back to 0, no lease, same run_at and priority');
SELECT is(queue.release(id, lease), false, 'releasing twice returns false') FROM took WHERE name = 'a';
SELECT is(queue.finish(id, lease), false, 'the released lease can no longer finish') FROM took WHERE name = 'a';
SELECT is((SELECT attempt FROM queue.take_next('rl.a')), 1, 'taken again, it is attempt 1 again');

-- Shutdowns never use up attempts: a stage allowing 2 attempts, released 5 times, still runs.
SELECT queue.configure_stage('rl.cap', max_attempts => 2);
INSERT INTO made VALUES ('cap', queue.enqueue('{"n": 2}', 'rl.cap'));
DO $$
DECLARE r record;
BEGIN
    FOR i IN 1..5 LOOP
        SELECT * INTO r FROM queue.take_next('rl.cap');
        PERFORM queue.release(r.id, r.lease);
    END LOOP;
END $$;
INSERT INTO took SELECT 'cap', k.* FROM queue.take_next('rl.cap') k;
SELECT is(attempt, 1, 'after five releases the next take is attempt 1') FROM took WHERE name = 'cap';
SELECT is(queue.fail(id, lease, 'first real failure', retry_in => '0'), true, 'its first real failure is a retry')
  FROM took WHERE name = 'cap';

-- A retry stays a retry: released, it waits as error with its error text and attempt.
INSERT INTO took SELECT 'cap2', k.* FROM queue.take_next('rl.cap') k;
SELECT is(queue.release(id, lease), true, 'the retry attempt is released') FROM took WHERE name = 'cap2';
SELECT results_eq(
    'SELECT status::text, attempt, error_text FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''cap'')',
    $$VALUES ('error', 1, 'first real failure')$$,
    'a released retry is an error-state task again, attempt and error text kept');

-- A task enqueued again with mode 'rerun' while it ran starts over with its new payload.
INSERT INTO made VALUES ('re', queue.enqueue('{"v": 1}', 'rl.re', key => 'k'));
INSERT INTO took SELECT 're', k.* FROM queue.take_next('rl.re') k;
SELECT queue.enqueue('{"v": 2}', 'rl.re', key => 'k', mode => 'rerun');
SELECT is(queue.release(id, lease), true, 'a task marked for re-run is released') FROM took WHERE name = 're';
SELECT results_eq(
    'SELECT status::text, attempt, rerun, payload FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''re'')',
    $$VALUES ('ready', 0, false, '{"v": 2}'::jsonb)$$,
    'released, a re-run task is ready from attempt 0 with its new payload');

-- A re-run starts clean: the error of the run it replaced does not make it an error-state task.
INSERT INTO made VALUES ('re2', queue.enqueue('{"v": 1}', 'rl.re2', key => 'k2'));
INSERT INTO took SELECT 're2a', k.* FROM queue.take_next('rl.re2') k;
SELECT queue.fail(id, lease, 'boom v1', retry_in => interval '0') FROM took WHERE name = 're2a';
INSERT INTO took SELECT 're2b', k.* FROM queue.take_next('rl.re2') k;
SELECT queue.enqueue('{"v": 2}', 'rl.re2', key => 'k2', mode => 'rerun');
SELECT is(queue.release(id, lease), true, 'a retried task marked for re-run is released') FROM took WHERE name = 're2b';
SELECT results_eq(
    'SELECT status::text, attempt, error_text, payload FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''re2'')',
    $$VALUES ('ready', 0, NULL::text, '{"v": 2}'::jsonb)$$,
    'released, a re-run of a failed task is ready from attempt 0, without the old run''s error');

-- A snooze: released with retry_in, due that long from now, the attempt not counted either.
SELECT throws_ok($$SELECT queue.release(1, gen_random_uuid(), retry_in => '-1 second')$$, '22023',
                 'retry_in must not be negative', 'release with a negative retry_in raises 22023');
INSERT INTO made VALUES ('sn', queue.enqueue('{"n": 3}', 'rl.sn', priority => 2));
INSERT INTO made VALUES ('sn2', queue.enqueue('{"n": 4}', 'rl.sn', priority => 2));
INSERT INTO took SELECT 'sn', k.* FROM queue.take_next('rl.sn') k;
SELECT is(id, (SELECT id FROM made WHERE name = 'sn'), 'setup: the first task is taken') FROM took WHERE name = 'sn';
SELECT throws_ok(format($$SELECT queue.release(%s, %L, retry_in => '-1 second')$$, id, lease), '22023',
                 'retry_in must not be negative', 'a negative retry_in raises 22023 for a task that is held')
  FROM took WHERE name = 'sn';
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'sn')), 'running',
          'and leaves it running');
SELECT is(queue.release(id, lease, retry_in => '1 hour'), true, 'release with retry_in returns true') FROM took WHERE name = 'sn';
SELECT results_eq(
    'SELECT status::text, attempt, lease, run_at, priority FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''sn'')',
    $$VALUES ('ready'::text, 0, NULL::uuid, now() + interval '1 hour', 2)$$,
    'a snoozed task is ready, attempt back to 0, no lease, due an hour from now, same priority');
SELECT is((SELECT array_agg(k.id) FROM queue.take_next('rl.sn', batch => 10) k),
          ARRAY[(SELECT id FROM made WHERE name = 'sn2')], 'until then a take passes it by');
SELECT is(queue.release(id, lease, retry_in => '0'), false, 'a snooze with a lease no longer current returns false')
  FROM took WHERE name = 'sn';

SELECT * FROM finish();
ROLLBACK;
