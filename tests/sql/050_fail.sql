-- fail(id, lease, error, fatal, retry_in): ends the current attempt with an error: retried after
-- retry_in or the stage's backoff, fatal when asked or out of attempts; a stale lease changes
-- nothing; error texts are bounded; a task re-run while it ran is queued again.
BEGIN;
SELECT plan(61);

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);
CREATE TEMP TABLE policy AS SELECT NULL::queue.stage_settings AS s WITH NO DATA;

-- Default policy (stage without a row): exponential from 10 s, ±10 % jitter, 5 attempts.
INSERT INTO made VALUES ('a', queue.enqueue('{"n": 1}', 'fl.a'));
INSERT INTO took SELECT 'a', k.* FROM queue.take_next('fl.a', worker => 'w-a') k;
SELECT is(queue.fail(id, lease, 'boom'), true, 'fail with the current lease returns true')
  FROM took WHERE name = 'a';
SELECT results_eq(
    'SELECT status::text, attempt, error_text, lease, lease_expires, payload FROM queue.live_tasks
      WHERE id = (SELECT id FROM made WHERE name = ''a'')',
    $$VALUES ('error', 1, 'boom', NULL::uuid, NULL::timestamptz, '{"n": 1}'::jsonb)$$,
    'a failed task waits as error: attempt kept, error text stored, lease cleared');
SELECT ok((SELECT run_at BETWEEN now() + interval '9 seconds' AND now() + interval '11 seconds'
             FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'a')),
          'the default backoff schedules the first retry 10 s ± 10 % ahead');
SELECT is_empty('SELECT 1 FROM queue.take_next(''fl.a'')', 'a task whose retry is not due is not taken');

-- Failing twice with the same lease.
CREATE TEMP TABLE before_a AS SELECT * FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'a');
SELECT is(queue.fail(id, lease, 'again'), false, 'a second fail with the same lease returns false')
  FROM took WHERE name = 'a';
SELECT results_eq('SELECT status::text, run_at, error_text, attempt, updated FROM queue.live_tasks WHERE id = (SELECT id FROM before_a)',
                  'SELECT status::text, run_at, error_text, attempt, updated FROM before_a',
                  'the second fail changed nothing');

-- retry_in => interval '0': due at once.
INSERT INTO made VALUES ('b', queue.enqueue('{"n": 2}', 'fl.b'));
INSERT INTO took SELECT 'b1', k.* FROM queue.take_next('fl.b') k;
SELECT is(queue.fail(id, lease, 'try again now', retry_in => interval '0'), true, 'fail with retry_in 0 returns true')
  FROM took WHERE name = 'b1';
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'b')), now(),
          'retry_in 0 makes the retry due now');
INSERT INTO took SELECT 'b2', k.* FROM queue.take_next('fl.b') k;
SELECT results_eq('SELECT id, attempt FROM took WHERE name = ''b2''',
                  'SELECT id, 2 FROM made WHERE name = ''b''',
                  'take_next takes the task again as attempt 2');
SELECT isnt((SELECT lease FROM took WHERE name = 'b2'), (SELECT lease FROM took WHERE name = 'b1'),
            'the new attempt has a new lease');
SELECT is(queue.fail(id, lease, 'stale'), false, 'fail with the lease of the earlier attempt returns false')
  FROM took WHERE name = 'b1';
SELECT results_eq('SELECT status::text, attempt, lease FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''b'')',
                  'SELECT ''running'', 2, lease FROM took WHERE name = ''b2''',
                  'the stale fail left the current attempt running');
SELECT is(queue.fail(id, lease, 'later', retry_in => interval '90 seconds'), true, 'fail with retry_in returns true')
  FROM took WHERE name = 'b2';
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'b')), now() + interval '90 seconds',
          'retry_in overrides the stage backoff');

-- Linear backoff without jitter: base * attempt.
INSERT INTO policy SELECT queue.configure_stage('fl.lin', max_attempts => 10, backoff => 'linear', backoff_base => interval '10 seconds',
                             backoff_jitter => 0);
INSERT INTO made VALUES ('lin', queue.enqueue('{"n": 3}', 'fl.lin'));
INSERT INTO took SELECT 'lin1', k.* FROM queue.take_next('fl.lin') k;
SELECT is(queue.fail(id, lease, 'x'), true, 'linear: attempt 1 fails') FROM took WHERE name = 'lin1';
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'lin')), now() + interval '10 seconds',
          'linear backoff: attempt 1 waits 10 s');
-- now() does not move in this transaction: as superuser, make the retry due now.
UPDATE queue.live_tasks SET run_at = now() WHERE id = (SELECT id FROM made WHERE name = 'lin');
INSERT INTO took SELECT 'lin2', k.* FROM queue.take_next('fl.lin') k;
SELECT is(queue.fail(id, lease, 'x'), true, 'linear: attempt 2 fails') FROM took WHERE name = 'lin2';
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'lin')), now() + interval '20 seconds',
          'linear backoff: attempt 2 waits 20 s');
UPDATE queue.live_tasks SET run_at = now() WHERE id = (SELECT id FROM made WHERE name = 'lin');  -- as superuser, see above
INSERT INTO took SELECT 'lin3', k.* FROM queue.take_next('fl.lin') k;
SELECT is(queue.fail(id, lease, 'x'), true, 'linear: attempt 3 fails') FROM took WHERE name = 'lin3';
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'lin')), now() + interval '30 seconds',
          'linear backoff: attempt 3 waits 30 s');

-- Exponential backoff without jitter: base * 2^(attempt-1), capped.
INSERT INTO policy SELECT queue.configure_stage('fl.exp', max_attempts => 10, backoff => 'exponential', backoff_base => interval '10 seconds',
                             backoff_cap => interval '35 seconds', backoff_jitter => 0);
INSERT INTO made VALUES ('exp', queue.enqueue('{"n": 4}', 'fl.exp'));
INSERT INTO took SELECT 'exp1', k.* FROM queue.take_next('fl.exp') k;
SELECT is(queue.fail(id, lease, 'x'), true, 'exponential: attempt 1 fails') FROM took WHERE name = 'exp1';
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'exp')), now() + interval '10 seconds',
          'exponential backoff: attempt 1 waits the base, 10 s');
UPDATE queue.live_tasks SET run_at = now() WHERE id = (SELECT id FROM made WHERE name = 'exp');  -- as superuser, see above
INSERT INTO took SELECT 'exp2', k.* FROM queue.take_next('fl.exp') k;
SELECT is(queue.fail(id, lease, 'x'), true, 'exponential: attempt 2 fails') FROM took WHERE name = 'exp2';
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'exp')), now() + interval '20 seconds',
          'exponential backoff: attempt 2 waits 20 s');
UPDATE queue.live_tasks SET run_at = now() WHERE id = (SELECT id FROM made WHERE name = 'exp');  -- as superuser, see above
INSERT INTO took SELECT 'exp3', k.* FROM queue.take_next('fl.exp') k;
SELECT is(queue.fail(id, lease, 'x'), true, 'exponential: attempt 3 fails') FROM took WHERE name = 'exp3';
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'exp')), now() + interval '35 seconds',
          'exponential backoff: attempt 3 waits the cap, 35 s, not 40 s');
-- Far past 30 doublings the delay is still the cap (3 hours * 2^30 does not fit an interval).
INSERT INTO policy SELECT queue.configure_stage('fl.far', max_attempts => 1000, backoff_base => interval '3 hours',
                                                backoff_cap => interval '1 day', backoff_jitter => 0);
INSERT INTO made VALUES ('far', queue.enqueue('{"n": 9}', 'fl.far'));
INSERT INTO took SELECT 'far', k.* FROM queue.take_next('fl.far') k;
-- As superuser: pretend 39 attempts failed before this one instead of failing them one by one.
UPDATE queue.live_tasks SET attempt = 40 WHERE id = (SELECT id FROM made WHERE name = 'far');
SELECT is(queue.fail(id, lease, 'x'), true, 'attempt 40 of an exponential 3-hour backoff fails without overflow')
  FROM took WHERE name = 'far';
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'far')), now() + interval '1 day',
          'exponential backoff after 40 attempts of 3 hours waits the cap');

-- Jitter 0.1: the delay lies within ±10 % of the backoff.
INSERT INTO policy SELECT queue.configure_stage('fl.jit', backoff_base => interval '100 seconds', backoff_cap => interval '1 hour',
                                                backoff_jitter => 0.1);
INSERT INTO made SELECT 'jit' || n, id FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[50]), 'fl.jit') WITH ORDINALITY AS e(id, n);
INSERT INTO took SELECT 'jit' || k.id, k.* FROM queue.take_next('fl.jit', batch => 50) k;
SELECT is((SELECT count(*)::integer FROM took t WHERE t.name LIKE 'jit%' AND queue.fail(t.id, t.lease, 'x')), 50,
          '50 tasks of a jittered stage fail');
SELECT ok((SELECT bool_and(run_at BETWEEN now() + interval '90 seconds' AND now() + interval '110 seconds')
             FROM queue.live_tasks WHERE stage = 'fl.jit'),
          'with jitter 0.1 every delay lies within 100 s ± 10 %');
SELECT cmp_ok((SELECT count(DISTINCT run_at)::integer FROM queue.live_tasks WHERE stage = 'fl.jit'), '>', 1,
              'with jitter the retries do not all fall at the same time');

-- Out of attempts: fatal, moved to history.
INSERT INTO policy SELECT queue.configure_stage('fl.max', max_attempts => 2);
INSERT INTO made VALUES ('max', queue.enqueue('{"n": 5}', 'fl.max'));
INSERT INTO took SELECT 'max1', k.* FROM queue.take_next('fl.max', worker => 'w-max') k;
SELECT is(queue.fail(id, lease, 'first', retry_in => interval '0'), true, 'attempt 1 of 2 fails')
  FROM took WHERE name = 'max1';
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'max')), 'error',
          'after attempt 1 of 2 the task waits for a retry');
INSERT INTO took SELECT 'max2', k.* FROM queue.take_next('fl.max', worker => 'w-max') k;
SELECT is(queue.fail(id, lease, 'second', retry_in => interval '0'), true, 'attempt 2 of 2 fails')
  FROM took WHERE name = 'max2';
SELECT is_empty('SELECT 1 FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''max'')',
                'a task out of attempts leaves queue.live_tasks');
SELECT results_eq(
    'SELECT status::text, attempt, error_text, worker, payload, finished FROM queue.history WHERE id = (SELECT id FROM made WHERE name = ''max'')',
    $$VALUES ('fatal', 2, 'second', 'w-max', '{"n": 5}'::jsonb, now())$$,
    'a task out of attempts is fatal in queue.history with its last error');

-- fatal => true: never retried.
INSERT INTO made VALUES ('fat', queue.enqueue('{"n": 6}', 'fl.fat'));
INSERT INTO took SELECT 'fat', k.* FROM queue.take_next('fl.fat') k;
SELECT is(queue.fail(id, lease, 'bad input', fatal => true), true, 'fail with fatal => true returns true')
  FROM took WHERE name = 'fat';
SELECT results_eq(
    'SELECT status::text, attempt, error_text FROM queue.tasks WHERE id = (SELECT id FROM made WHERE name = ''fat'')',
    $$VALUES ('fatal', 1, 'bad input')$$,
    'fatal => true makes the task fatal on its first attempt, in history only');
SELECT is(queue.fail(id, lease, 'bad input', fatal => true), false, 'failing a fatal task again returns false')
  FROM took WHERE name = 'fat';

-- A wrong lease changes nothing.
INSERT INTO made VALUES ('w', queue.enqueue('{"n": 7}', 'fl.w'));
INSERT INTO took SELECT 'w', k.* FROM queue.take_next('fl.w') k;
SELECT is(queue.fail(id, gen_random_uuid(), 'not mine'), false, 'fail with a wrong lease returns false')
  FROM took WHERE name = 'w';
SELECT is(queue.fail(id, gen_random_uuid(), 'not mine', fatal => true), false, 'fatal fail with a wrong lease returns false')
  FROM took WHERE name = 'w';
SELECT results_eq('SELECT status::text, attempt, lease, error_text FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''w'')',
                  'SELECT ''running'', 1, lease, NULL::text FROM took WHERE name = ''w''',
                  'after a wrong lease the task still runs under its lease with no error');

-- Error texts.
INSERT INTO made SELECT 'e' || n, id FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[3]), 'fl.e') WITH ORDINALITY AS e(id, n);
INSERT INTO took SELECT m.name, k.* FROM queue.take_next('fl.e', batch => 3) k JOIN made m ON m.id = k.id;
SELECT is(queue.fail(id, lease, repeat('x', 5000)), true, 'fail with an error text of 5000 characters returns true') FROM took WHERE name = 'e1';
SELECT is(queue.fail(id, lease, repeat('y', 2000)), true, 'fail with an error text of 2000 characters returns true') FROM took WHERE name = 'e2';
SELECT is(queue.fail(id, lease, NULL), true, 'fail with a NULL error returns true') FROM took WHERE name = 'e3';
SELECT cmp_ok((SELECT length(error_text) FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'e1')), '<=', 2000,
              'an error text of 5000 characters is kept as at most 2000');
SELECT ok((SELECT error_text LIKE 'xxxxxxxxxx%[cut, 5000 characters in all]'
             FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'e1')),
          'a cut error text keeps its start and ends with [cut, 5000 characters in all]');
SELECT is((SELECT error_text FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'e2')), repeat('y', 2000),
          'an error text of exactly 2000 characters is kept whole');
SELECT isnt((SELECT error_text FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'e3')), NULL,
            'a NULL error gives a non-NULL error text');

-- Arguments that are not usable raise, and change nothing.
INSERT INTO made VALUES ('v', queue.enqueue('{"n": 8}', 'fl.v'));
INSERT INTO took SELECT 'v', k.* FROM queue.take_next('fl.v') k;
SELECT throws_ok(format('SELECT queue.fail(%s, %L, %L, retry_in => %L)', id, lease, 'x', '-1 second'),
                 '22023', 'retry_in must not be negative', 'a negative retry_in raises 22023')
  FROM took WHERE name = 'v';
SELECT throws_ok(format('SELECT queue.fail(NULL, %L, %L)', lease, 'x'),
                 '22004', 'id and lease must not be NULL', 'fail with a NULL id raises 22004')
  FROM took WHERE name = 'v';
SELECT throws_ok(format('SELECT queue.fail(%s, NULL, %L)', id, 'x'),
                 '22004', 'id and lease must not be NULL', 'fail with a NULL lease raises 22004')
  FROM took WHERE name = 'v';
SELECT throws_ok(format('SELECT queue.fail(%s, %L, %L, fatal => NULL)', id, lease, 'x'),
                 '22004', 'fatal must not be NULL', 'fail with fatal NULL raises 22004, not a silent retry')
  FROM took WHERE name = 'v';
SELECT throws_ok(format('SELECT queue.fail(%s, %L, %L)', id, 'not-a-uuid', 'x'),
                 '22P02', 'invalid input syntax for type uuid: "not-a-uuid"', 'fail with a lease that is not a UUID raises 22P02')
  FROM took WHERE name = 'v';
SELECT results_eq('SELECT status::text, attempt, lease, error_text FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''v'')',
                  'SELECT ''running'', 1, lease, NULL::text FROM took WHERE name = ''v''',
                  'after the raising calls the task still runs under its lease with no error');

-- Re-run while running: the failed attempt is not retried, the new payload runs from attempt 0.
INSERT INTO made VALUES ('r', queue.enqueue('{"v": 1}', 'fl.r', key => 'r-1'));
INSERT INTO took SELECT 'r', k.* FROM queue.take_next('fl.r') k;
SELECT is(queue.enqueue('{"v": 2}', 'fl.r', key => 'r-1', mode => 'rerun'), id,
          'a rerun enqueue of a running task returns its id')
  FROM made WHERE name = 'r';
SELECT is(queue.fail(id, lease, 'old payload failed'), true, 'fail of a task re-run while it ran returns true')
  FROM took WHERE name = 'r';
SELECT results_eq(
    'SELECT status::text, attempt, payload, run_at, lease, rerun, error_text FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''r'')',
    $$VALUES ('ready', 0, '{"v": 2}'::jsonb, now(), NULL::uuid, false, NULL::text)$$,
    'the re-run task is ready now at attempt 0 with the new payload, without the replaced run''s error');

-- A long backoff base and a high attempt stay within range (2^(attempt-1) is capped before it overflows).
SELECT queue.configure_stage('fl.big', backoff_base => interval '1 year', backoff_cap => interval '10 years',
                             max_attempts => 5000);
SELECT ok(queue._retry_delay(queue._settings('fl.big'), 2000) BETWEEN interval '9 years' AND interval '11 years',
          'attempt 2000 with a base of a year waits the cap, not a float overflow');

-- A fatal task keeps its group_key in history.
INSERT INTO made VALUES ('g', queue.enqueue('{}', 'fl.g', group_key => 'tenant-fl'));
SELECT is(queue.fail(k.id, k.lease, 'bad', fatal => true), true, 'setup: a grouped task fails for good') FROM queue.take_next('fl.g') k;
SELECT results_eq('SELECT status::text, group_key FROM queue.history WHERE id = (SELECT id FROM made WHERE name = ''g'')',
                  $$VALUES ('fatal', 'tenant-fl')$$,
                  'the fatal row keeps the task''s group_key');

SELECT * FROM finish();
ROLLBACK;
