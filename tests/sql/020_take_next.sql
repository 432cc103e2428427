-- queue.take_next: order, due times, stages, batches, the attempt and its lease, errors.
-- Concurrency (SKIP LOCKED gives concurrent callers disjoint tasks) needs several sessions and is
-- tested in tests/py. now() is fixed for the transaction, so lease_expires compares exactly.
BEGIN;
SELECT plan(39);

CREATE TEMP TABLE ids (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (seq serial PRIMARY KEY, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);

SELECT is(pg_catalog.pg_get_function_result('queue.take_next(text,integer,interval,text)'::regprocedure),
          'TABLE(id bigint, payload jsonb, attempt integer, lease uuid, lease_expires timestamp with time zone, priority integer, key text)',
          'take_next returns id, payload, attempt, lease (uuid), lease_expires, priority, key');

-- Order: lowest priority, then earliest run_at, then lowest id; future run_at is not taken -------
INSERT INTO ids VALUES
    ('late_low',   queue.enqueue('{"t": "a"}', stage => 'ord', priority => 5, run_at => now() - interval '1 hour')),
    ('p1_recent',  queue.enqueue('{"t": "b"}', stage => 'ord', priority => 1, run_at => now() - interval '1 minute')),
    ('p1_old',     queue.enqueue('{"t": "c"}', stage => 'ord', priority => 1, run_at => now() - interval '10 minutes')),
    ('p1_old_too', queue.enqueue('{"t": "d"}', stage => 'ord', priority => 1, run_at => now() - interval '10 minutes')),
    ('future',     queue.enqueue('{"t": "e"}', stage => 'ord', priority => -3, run_at => now() + interval '1 second'));

INSERT INTO took (id, payload, attempt, lease, lease_expires, priority, key) SELECT * FROM queue.take_next('ord');
INSERT INTO took (id, payload, attempt, lease, lease_expires, priority, key) SELECT * FROM queue.take_next('ord');
INSERT INTO took (id, payload, attempt, lease, lease_expires, priority, key) SELECT * FROM queue.take_next('ord');
INSERT INTO took (id, payload, attempt, lease, lease_expires, priority, key) SELECT * FROM queue.take_next('ord');

SELECT results_eq(
    $$SELECT i.name FROM took k JOIN ids i ON i.id = k.id ORDER BY k.seq$$,
    ARRAY['p1_old', 'p1_old_too', 'p1_recent', 'late_low'],
    'tasks are taken by lowest priority, then earliest run_at, then lowest id'
);
SELECT is_empty($$SELECT * FROM queue.take_next('ord')$$,
                'a task whose run_at is in the future is not taken, whatever its priority');
SELECT is((SELECT t.status::text FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'future')), 'ready',
          'the future task is still ready');

-- set_priority while waiting changes the order ----------------------------------------------------
INSERT INTO ids VALUES
    ('first',  queue.enqueue('{}', stage => 'prio', run_at => now() - interval '1 minute')),
    ('second', queue.enqueue('{}', stage => 'prio'));
SELECT lives_ok($$SELECT queue.set_priority((SELECT id FROM ids WHERE name = 'second'), -1)$$,
                'setup: set_priority lowers the later task''s priority');
SELECT is((SELECT k.id FROM queue.take_next('prio') k), (SELECT id FROM ids WHERE name = 'second'),
          'a priority lowered with set_priority while the task waits puts it first');

-- Only the given stage ----------------------------------------------------------------------------
INSERT INTO ids VALUES ('elsewhere', queue.enqueue('{}', stage => 'other'));
SELECT is((SELECT k.id FROM queue.take_next('prio') k), (SELECT id FROM ids WHERE name = 'first'),
          'take_next(stage) takes from that stage only');
SELECT is_empty($$SELECT * FROM queue.take_next('prio')$$,
                'once its stage is empty, take_next returns nothing although another stage has a ready task');
SELECT is((SELECT t.status::text FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'elsewhere')), 'ready',
          'the task of the other stage was not touched');
SELECT is_empty($$SELECT * FROM queue.take_next('nothing.here')$$, 'a stage without tasks returns zero rows');

-- Batches -------------------------------------------------------------------------------------------
INSERT INTO ids SELECT 'many' || b.ord, b.id
  FROM queue.enqueue_batch(pg_catalog.array_fill('{}'::jsonb, ARRAY[5]), stage => 'many') WITH ORDINALITY AS b(id, ord);
CREATE TEMP TABLE batch1 AS SELECT * FROM queue.take_next('many', batch => 3);
SELECT is((SELECT pg_catalog.count(DISTINCT b.id)::integer FROM batch1 b), 3, 'batch => 3 returns 3 distinct tasks');
SELECT is((SELECT pg_catalog.count(DISTINCT b.lease)::integer FROM batch1 b), 3, 'each task of a batch gets its own lease');
SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.live_tasks t JOIN batch1 b ON b.id = t.id WHERE t.status = 'running'),
          3, 'every task of the batch is running');
CREATE TEMP TABLE batch2 AS SELECT * FROM queue.take_next('many', batch => 3);
SELECT is((SELECT pg_catalog.count(*)::integer FROM batch2), 2, 'batch => 3 returns what is left when fewer are due');
SELECT is_empty($$SELECT b.id FROM batch1 b INTERSECT SELECT b.id FROM batch2 b$$,
                'the second batch holds none of the first');

-- What an attempt gets and records --------------------------------------------------------------------
INSERT INTO ids VALUES ('attempt', queue.enqueue('{"x": 1}', stage => 'att', priority => 4, key => 'att-1'));
TRUNCATE took RESTART IDENTITY;
INSERT INTO took (id, payload, attempt, lease, lease_expires, priority, key)
SELECT * FROM queue.take_next('att', lease_for => interval '90 seconds', worker => 'host-a:123');

SELECT results_eq(
    $$SELECT k.id, k.payload, k.attempt, k.priority, k.key, k.lease_expires FROM took k$$,
    $$SELECT (SELECT id FROM ids WHERE name = 'attempt'), '{"x": 1}'::jsonb, 1, 4, 'att-1'::text, now() + interval '90 seconds'$$,
    'take_next returns the task''s id, payload, attempt 1, priority, key and lease_expires = now() + lease_for'
);
SELECT results_eq(
    $$SELECT v.status::text, t.lease, v.lease_expires, v.started, v.worker, v.attempt
        FROM queue.tasks v JOIN queue.live_tasks t ON t.id = v.id
       WHERE v.id = (SELECT id FROM ids WHERE name = 'attempt')$$,
    $$SELECT 'running'::text, k.lease, now() + interval '90 seconds', now(), 'host-a:123'::text, 1 FROM took k$$,
    'queue.tasks shows the taken task running, started now(), with the worker''s name; its lease is the one returned'
);
SELECT isnt((SELECT k.lease FROM took k), NULL, 'the lease is a uuid');

-- A retry: the attempt counts up and the lease is new.
SELECT ok(queue.fail(k.id, k.lease, 'transient', retry_in => interval '0'), 'setup: the attempt fails, retry due now')
  FROM took k;
INSERT INTO took (id, payload, attempt, lease, lease_expires, priority, key) SELECT * FROM queue.take_next('att');
SELECT results_eq(
    $$SELECT k.attempt FROM took k ORDER BY k.seq$$,
    ARRAY[1, 2],
    'each take of the same task increments attempt'
);
SELECT isnt((SELECT k.lease FROM took k WHERE k.seq = 2), (SELECT k.lease FROM took k WHERE k.seq = 1),
            'each attempt gets a new lease');
SELECT is((SELECT t.worker FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'attempt')), NULL,
          'a take without worker name records none (the previous attempt''s name is not kept)');

-- lease_for default: the stage's lease_duration, or the '*' defaults -----------------------------------
DO $$
BEGIN
    PERFORM queue.configure_stage('lease7', lease_duration => interval '7 minutes');
END
$$;
INSERT INTO ids VALUES ('lease7', queue.enqueue('{}', stage => 'lease7')), ('plain', queue.enqueue('{}', stage => 'plain'));
SELECT is((SELECT k.lease_expires FROM queue.take_next('lease7') k), now() + interval '7 minutes',
          'without lease_for, the lease lasts the stage''s lease_duration');
SELECT is((SELECT k.lease_expires FROM queue.take_next('plain') k),
          now() + (SELECT s.lease_duration FROM queue.stage_settings s WHERE s.stage = '*'),
          'a stage without settings uses the lease_duration of the ''*'' defaults row');

-- 'error' tasks: taken once their retry is due -----------------------------------------------------------
INSERT INTO ids VALUES
    ('err_due',   queue.enqueue('{}', stage => 'err')),
    ('err_later', queue.enqueue('{}', stage => 'err'));
UPDATE queue.live_tasks t SET status = 'error', attempt = 1, error_text = 'earlier failure', run_at = now() - interval '1 second'
 WHERE t.id = (SELECT id FROM ids WHERE name = 'err_due');
UPDATE queue.live_tasks t SET status = 'error', attempt = 1, error_text = 'earlier failure', run_at = now() + interval '1 minute'
 WHERE t.id = (SELECT id FROM ids WHERE name = 'err_later');
SELECT results_eq(
    $$SELECT k.id, k.attempt FROM queue.take_next('err', batch => 10) k$$,
    $$SELECT (SELECT id FROM ids WHERE name = 'err_due'), 2$$,
    'an error task whose retry is due is taken (attempt 2); one not yet due is not'
);

-- Limits that are accepted ------------------------------------------------------------------------------
SELECT lives_ok($$SELECT * FROM queue.take_next('limits', batch => 10000, worker => pg_catalog.repeat('w', 200))$$,
                'batch => 10000 and a worker name of 200 characters are accepted');

-- Roles -------------------------------------------------------------------------------------------------
INSERT INTO ids VALUES ('roles', queue.enqueue('{}', stage => 'roles'));
SET LOCAL ROLE skiplock_producer;
SELECT throws_ok($$SELECT * FROM queue.take_next('roles')$$, '42501', 'permission denied for function take_next',
                 'skiplock_producer may not take tasks (42501)');
RESET ROLE;
SET LOCAL ROLE skiplock_worker;
SELECT lives_ok($$SELECT * FROM queue.take_next('roles')$$, 'skiplock_worker may take tasks');
RESET ROLE;

-- Errors: each raises its SQLSTATE and takes nothing ---------------------------------------------------------
INSERT INTO ids VALUES ('untouched', queue.enqueue('{}', stage => 'untouched'));
CREATE TEMP TABLE before_errors AS
SELECT pg_catalog.md5(pg_catalog.string_agg(t::text, '|' ORDER BY t.id)) AS digest FROM queue.live_tasks t;

SELECT throws_ok($$SELECT * FROM queue.take_next('untouched', batch => 0)$$, '22023', 'batch out of range', 'batch => 0 raises 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next('untouched', batch => -1)$$, '22023', 'batch out of range', 'batch => -1 raises 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next('untouched', batch => 10001)$$, '22023', 'batch out of range', 'batch => 10001 raises 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next('untouched', batch => NULL)$$, '22023', 'batch out of range', 'batch => NULL raises 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next('untouched', lease_for => interval '0')$$,
                 '22023', 'lease_for must be positive', 'lease_for => 0 raises 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next('untouched', lease_for => interval '-1 minute')$$,
                 '22023', 'lease_for must be positive', 'a negative lease_for raises 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next('untouched', worker => pg_catalog.repeat('w', 201))$$,
                 '22023', 'worker name too long', 'a worker name of 201 characters raises 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next(NULL)$$, '22004', 'stage must not be NULL', 'a NULL stage raises 22004');
SELECT throws_ok($$SELECT * FROM queue.take_next('')$$, '22023', 'invalid stage name', 'an empty stage raises 22023');
SELECT throws_ok($$SELECT * FROM queue.take_next('*')$$, '22023', 'invalid stage name', 'stage ''*'' raises 22023');

SELECT is((SELECT pg_catalog.md5(pg_catalog.string_agg(t::text, '|' ORDER BY t.id)) FROM queue.live_tasks t),
          (SELECT digest FROM before_errors),
          'the failed calls took nothing: queue.live_tasks is exactly as it was');

SELECT * FROM finish();
ROLLBACK;
