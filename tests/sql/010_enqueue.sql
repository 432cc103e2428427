-- queue.enqueue: defaults, named arguments, keys (ignore / rerun), stages, errors.
-- now() is fixed for the transaction, so run_at and created compare exactly with it.
BEGIN;
SELECT plan(68);

CREATE TEMP TABLE ids (name text PRIMARY KEY, id bigint);

-- Defaults ---------------------------------------------------------------------------------------
SELECT is(pg_catalog.pg_typeof(queue.enqueue('{"doc": 0}'::jsonb))::text, 'bigint',
          'enqueue returns a bigint');

INSERT INTO ids VALUES ('plain', queue.enqueue('{"doc": 1}'::jsonb));

SELECT isnt((SELECT id FROM ids WHERE name = 'plain'), NULL, 'enqueue returns the new task''s id');

SELECT results_eq(
    $$SELECT t.stage, t.status::text, t.priority, t.payload, t.key, t.attempt, t.rerun, t.lease
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'plain')$$,
    $$VALUES ('default'::text, 'ready'::text, 0, '{"doc": 1}'::jsonb, NULL::text, 0, false, NULL::uuid)$$,
    'enqueue(payload) alone: stage ''default'', ready, priority 0, no key, attempt 0, no lease'
);

SELECT results_eq(
    $$SELECT t.run_at, t.created FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'plain')$$,
    $$VALUES (now(), now())$$,
    'run_at defaults to now() (due at once); created is now()'
);

SELECT results_eq(
    $$SELECT t.repeat, t.drift, t.slot, t.group_key FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'plain')$$,
    $$VALUES (NULL::interval, true, NULL::timestamptz, NULL::text)$$,
    'a plain task is one-off (no repeat, no slot), drift true by default, without group'
);

-- Named notation, every field -------------------------------------------------------------------
INSERT INTO ids VALUES ('named', queue.enqueue(payload => '{}', stage => 'resize', priority => -5,
                                               run_at => now() + interval '1 minute', key => 'doc-42'));

SELECT results_eq(
    $$SELECT t.stage, t.status::text, t.priority, t.run_at, t.payload, t.key, t.attempt
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'named')$$,
    $$VALUES ('resize'::text, 'ready'::text, -5, now() + interval '1 minute', '{}'::jsonb, 'doc-42'::text, 0)$$,
    'named-argument form stores stage, priority, run_at, payload and key'
);

-- Periodic and grouped tasks ---------------------------------------------------------------------
INSERT INTO ids VALUES ('periodic', queue.enqueue('{"job": "report"}', stage => 'cron', run_at => now() + interval '10 minutes',
                                                  repeat => interval '1 hour', drift => false, group_key => 'tenant-1'));
SELECT results_eq(
    $$SELECT t.run_at, t.repeat, t.drift, t.slot, t.group_key, t.status::text
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'periodic')$$,
    $$VALUES (now() + interval '10 minutes', interval '1 hour', false, now() + interval '10 minutes', 'tenant-1'::text, 'ready'::text)$$,
    'repeat, drift and group_key are stored; a periodic task''s first slot is its run_at'
);
INSERT INTO ids VALUES ('periodic_now', queue.enqueue('{}', stage => 'cron', repeat => interval '1 day'));
SELECT results_eq(
    $$SELECT t.run_at, t.slot, t.drift FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'periodic_now')$$,
    $$VALUES (now(), now(), true)$$,
    'a periodic task without run_at runs first now, its slot now, with drift by default'
);

-- Keys, mode 'ignore' (the default) -------------------------------------------------------------
SELECT is(queue.enqueue(payload => '{"other": true}', stage => 'resize', priority => 9, key => 'doc-42'),
          (SELECT id FROM ids WHERE name = 'named'),
          'mode ''ignore'': the same key in the same stage returns the existing task''s id');

SELECT results_eq(
    $$SELECT t.priority, t.run_at, t.payload, t.status::text, t.attempt
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'named')$$,
    $$VALUES (-5, now() + interval '1 minute', '{}'::jsonb, 'ready'::text, 0)$$,
    'mode ''ignore'' changes nothing in the existing task'
);

SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.live_tasks t WHERE t.stage = 'resize' AND t.key = 'doc-42'), 1,
          'mode ''ignore'' adds no second task for the key');

SELECT isnt(queue.enqueue(payload => '{}', stage => 'thumbnail', key => 'doc-42'),
            (SELECT id FROM ids WHERE name = 'named'),
            'the same key in another stage is a different task');

-- Keys, mode 'rerun' on a waiting task: it starts over with the new values -----------------------
-- Make the task look like it failed twice and waits for a retry.
UPDATE queue.live_tasks t
   SET status = 'error', attempt = 2, error_text = 'boom', run_at = now() + interval '1 hour'
 WHERE t.id = (SELECT id FROM ids WHERE name = 'named');

SELECT is(queue.enqueue(payload => '{"v": 2}', stage => 'resize', priority => 3, key => 'doc-42', mode => 'rerun'),
          (SELECT id FROM ids WHERE name = 'named'),
          'mode ''rerun'' on a waiting task returns the same id');

SELECT results_eq(
    $$SELECT t.status::text, t.payload, t.priority, t.run_at, t.attempt, t.error_text, t.rerun
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'named')$$,
    $$VALUES ('ready'::text, '{"v": 2}'::jsonb, 3, now(), 0, NULL::text, false)$$,
    'mode ''rerun'' on a waiting task: ready now with the new payload and priority, attempt 0, error cleared'
);

-- Keys, mode 'rerun' on a running task: it keeps running, its finish queues it again --------------
INSERT INTO ids VALUES ('running', queue.enqueue('{"v": 1}', stage => 'rr', key => 'doc-7'));
CREATE TEMP TABLE taken AS SELECT * FROM queue.take_next('rr');

SELECT is(queue.enqueue('{"v": 3}', stage => 'rr', key => 'doc-7', mode => 'rerun'),
          (SELECT id FROM ids WHERE name = 'running'),
          'mode ''rerun'' on a running task returns the same id');

SELECT results_eq(
    $$SELECT t.status::text, t.rerun, t.lease, t.attempt, t.payload
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'running')$$,
    $$SELECT 'running'::text, true, k.lease, 1, '{"v": 3}'::jsonb FROM taken k$$,
    'mode ''rerun'' on a running task: still running under the same lease and attempt, rerun set, new payload'
);

SELECT ok(queue.finish(k.id, k.lease), 'the worker''s finish of a task marked rerun returns true')
  FROM taken k;

SELECT results_eq(
    $$SELECT t.status::text, t.rerun, t.attempt, t.lease, t.payload
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'running')$$,
    $$VALUES ('ready'::text, false, 0, NULL::uuid, '{"v": 3}'::jsonb)$$,
    'after finish, a task marked rerun is ready again from attempt 0 with the new payload'
);

-- Keys, mode 'rerun' on a periodic task: repeat and drift follow the new call, group_key stays --
INSERT INTO ids VALUES ('sched', queue.enqueue('{"v": 1}', stage => 'cron', key => 'nightly', run_at => now() - interval '1 minute',
                                               repeat => interval '1 day', group_key => 'g-first'));
SELECT is(queue.enqueue('{"v": 2}', stage => 'cron', key => 'nightly', run_at => now() + interval '1 hour',
                        repeat => interval '2 hours', drift => false, group_key => 'g-other'),
          (SELECT id FROM ids WHERE name = 'sched'),
          'mode ''ignore'' with another repeat returns the scheduled task''s id');
SELECT results_eq(
    $$SELECT t.repeat, t.drift, t.payload, t.group_key FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'sched')$$,
    $$VALUES (interval '1 day', true, '{"v": 1}'::jsonb, 'g-first'::text)$$,
    'mode ''ignore'' leaves the schedule as it was'
);
SELECT is(queue.enqueue('{"v": 3}', stage => 'cron', key => 'nightly', mode => 'rerun', run_at => now() + interval '1 hour',
                        repeat => interval '2 hours', drift => false, group_key => 'g-other'),
          (SELECT id FROM ids WHERE name = 'sched'),
          'mode ''rerun'' of a periodic task returns its id');
SELECT results_eq(
    $$SELECT t.run_at, t.repeat, t.drift, t.slot, t.payload, t.group_key
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'sched')$$,
    $$VALUES (now() + interval '1 hour', interval '2 hours', false, now() + interval '1 hour', '{"v": 3}'::jsonb, 'g-first'::text)$$,
    'mode ''rerun'' takes the new run_at (as the new slot), repeat, drift and payload; the group_key stays the first one'
);
SELECT is(queue.enqueue('{"v": 4}', stage => 'cron', key => 'nightly', mode => 'rerun'),
          (SELECT id FROM ids WHERE name = 'sched'),
          'mode ''rerun'' without repeat returns the same id');
SELECT results_eq(
    $$SELECT t.repeat, t.slot, t.run_at FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'sched')$$,
    $$VALUES (NULL::interval, NULL::timestamptz, now())$$,
    'mode ''rerun'' without repeat makes the task a one-off, due now'
);

-- A key is unique among live tasks only: once the task finished, the key may be used again -------
INSERT INTO ids VALUES ('once', queue.enqueue('{}', stage => 'fin', key => 'once'));
SELECT ok(queue.finish(k.id, k.lease), 'setup: the keyed task is taken and finished')
  FROM queue.take_next('fin') k;

SELECT is((SELECT h.status::text FROM queue.history h WHERE h.id = (SELECT id FROM ids WHERE name = 'once')), 'done',
          'setup: the finished keyed task is in history');

INSERT INTO ids VALUES ('again', queue.enqueue('{"again": true}', stage => 'fin', key => 'once'));

SELECT isnt((SELECT id FROM ids WHERE name = 'again'), (SELECT id FROM ids WHERE name = 'once'),
            'the key of a finished task can be used again: a new task, a new id');

SELECT results_eq(
    $$SELECT t.status::text, t.key, t.payload FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ids WHERE name = 'again')$$,
    $$VALUES ('ready'::text, 'once'::text, '{"again": true}'::jsonb)$$,
    'the task enqueued again with a used key is live and ready'
);

-- Wake-ups ---------------------------------------------------------------------------------------
-- The longest stage name (54 bytes) gives the longest channel, skiplock.<54 bytes> = 63 bytes;
-- pg_notify raises on a longer one at the call, so this proves the NOTIFY goes through. Enqueue
-- notifies only while a worker waits: an empty take_next makes it so.
SELECT pg_catalog.count(*) FROM queue.take_next(pg_catalog.repeat('s', 54));
SELECT lives_ok(
    $$SELECT queue.enqueue('{}', stage => pg_catalog.repeat('s', 54))$$,
    'a 54-byte stage name is accepted and its NOTIFY channel skiplock.<stage> fits'
);
SELECT lives_ok(
    $$SELECT queue.enqueue('{}', stage => pg_catalog.repeat('é', 27))$$,
    'stage names are limited in bytes: 27 two-byte characters (54 bytes) are accepted'
);
-- Notifications are queued only at commit, and this file rolls back: delivery on channel
-- 'skiplock.<stage>' (and notify => false) is tested by pytest with a LISTENing connection.
SELECT skip('NOTIFY skiplock.<stage> is delivered at commit; this file rolls back (covered in tests/py)', 1);

-- Limits that are accepted -------------------------------------------------------------------------
SELECT lives_ok(
    $$SELECT queue.enqueue('{}', stage => 'limits', key => pg_catalog.repeat('k', 1000))$$,
    'a key of 1000 characters is accepted'
);
SELECT lives_ok(
    $$SELECT queue.enqueue(pg_catalog.jsonb_build_object('blob', pg_catalog.repeat('x', 1000000)), stage => 'limits')$$,
    'a payload just under 1 MiB is accepted'
);
SELECT lives_ok(
    $$SELECT queue.enqueue('[1, 2, 3]', stage => 'limits')$$,
    'a JSON array is a valid payload'
);
SELECT lives_ok(
    $$SELECT queue.enqueue('{}', stage => 'limits', repeat => interval '1 second', group_key => pg_catalog.repeat('g', 200))$$,
    'repeat => 1 second and a group_key of 200 characters are accepted'
);
SELECT lives_ok(
    $$SELECT queue.enqueue('{}', stage => 'limits', repeat => interval '1 month 1 day 00:00:01')$$,
    'a repeat with months, days and time (all positive) is accepted'
);

-- Roles -----------------------------------------------------------------------------------------
SET LOCAL ROLE skiplock_producer;
SELECT lives_ok($$SELECT queue.enqueue('{"by": "producer"}', stage => 'roles')$$,
                'skiplock_producer may enqueue');
RESET ROLE;
SET LOCAL ROLE skiplock_worker;
SELECT throws_ok($$SELECT queue.enqueue('{"by": "worker"}', stage => 'roles')$$,
                 '42501', 'permission denied for function enqueue',
                 'skiplock_worker may not enqueue (42501)');
RESET ROLE;

-- Errors: each raises its SQLSTATE and changes nothing -----------------------------------------------
CREATE TEMP TABLE before_errors AS
SELECT pg_catalog.count(*) AS n, pg_catalog.md5(pg_catalog.string_agg(t::text, '|' ORDER BY t.id)) AS digest
  FROM queue.live_tasks t;

SELECT throws_ok($$SELECT queue.enqueue('{}', stage => NULL)$$,
                 '22004', 'stage must not be NULL', 'a NULL stage raises 22004');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => '')$$,
                 '22023', 'invalid stage name', 'an empty stage raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => '*')$$,
                 '22023', 'invalid stage name', 'stage ''*'' (the defaults row) raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => pg_catalog.repeat('s', 55))$$,
                 '22023', 'invalid stage name', 'a 55-byte stage raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => pg_catalog.repeat('é', 28))$$,
                 '22023', 'invalid stage name', 'a stage of 28 characters but 56 bytes raises 22023');
SELECT throws_ok($$SELECT queue.enqueue(NULL)$$,
                 '22004', 'payload must not be NULL', 'a NULL payload raises 22004');
SELECT throws_ok($$SELECT queue.enqueue('42')$$,
                 '22023', 'payload must be a JSON object or array', 'a JSON number payload raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('"text"')$$,
                 '22023', 'payload must be a JSON object or array', 'a JSON string payload raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('null')$$,
                 '22023', 'payload must be a JSON object or array', 'a JSON null payload raises 22023');
SELECT throws_ok($$SELECT queue.enqueue(pg_catalog.jsonb_build_object('blob', pg_catalog.repeat('x', 1100000)))$$,
                 '54000', 'payload too large', 'a payload over 1 MiB raises 54000');
SELECT throws_ok($$SELECT queue.enqueue('{}', priority => NULL)$$,
                 '22004', 'priority must not be NULL', 'a NULL priority raises 22004');
SELECT throws_ok($$SELECT queue.enqueue('{}', key => 'k', mode => 'replace')$$,
                 '22023', 'unknown enqueue mode', 'an unknown mode raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', key => 'k', mode => NULL)$$,
                 '22023', 'unknown enqueue mode', 'a NULL mode raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', key => '')$$,
                 '22023', 'invalid key', 'an empty key raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', key => pg_catalog.repeat('k', 1001))$$,
                 '22023', 'invalid key', 'a key of 1001 characters raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => 'cron', repeat => interval '0')$$,
                 '22023', 'invalid repeat', 'repeat => 0 raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => 'cron', repeat => interval '-1 hour')$$,
                 '22023', 'invalid repeat', 'a negative repeat raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => 'cron', repeat => interval '0.5 seconds')$$,
                 '22023', 'invalid repeat', 'a repeat under 1 second raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => 'cron', repeat => interval '1 day -1 hour')$$,
                 '22023', 'invalid repeat', 'a repeat with a negative part (1 day -1 hour) raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => 'cron', repeat => interval '1 month -1 day')$$,
                 '22023', 'invalid repeat', 'a repeat with a negative day part (1 month -1 day) raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => 'cron', repeat => interval '1 hour', drift => NULL)$$,
                 '22004', 'drift must not be NULL', 'a NULL drift raises 22004');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => 'cron', group_key => '')$$,
                 '22023', 'invalid group_key', 'an empty group_key raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', stage => 'cron', group_key => pg_catalog.repeat('g', 201))$$,
                 '22023', 'invalid group_key', 'a group_key of 201 characters raises 22023');
SELECT throws_ok($$SELECT queue.enqueue('{"v": 9}', stage => 'resize', key => 'doc-42', mode => 'rerun', priority => NULL)$$,
                 '22004', 'priority must not be NULL', 'a bad argument with mode ''rerun'' raises before touching the keyed task');

SELECT results_eq(
    $$SELECT pg_catalog.count(*), pg_catalog.md5(pg_catalog.string_agg(t::text, '|' ORDER BY t.id)) FROM queue.live_tasks t$$,
    $$SELECT n, digest FROM before_errors$$,
    'the failed calls left queue.live_tasks exactly as it was'
);

SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.live_tasks t WHERE t.stage = 'default'),
          2, 'stage ''default'' holds just the two tasks enqueued without a stage');

-- Issue 54, item 4: a limit bounds the size a reader gets, not the stored (compressed) size. A
-- jsonb of repeated text read from a table column arrives compressed, far under 1 MiB.
CREATE TEMP TABLE big_values AS
SELECT pg_catalog.jsonb_build_object('blob', pg_catalog.repeat('skiplock ', 500000)) AS huge,     -- 4.5 MB
       pg_catalog.jsonb_build_object('blob', pg_catalog.repeat('skiplock ', 50000)) AS fine,      -- 450 kB
       pg_catalog.repeat('k', 200000) AS long_key;
SELECT ok((SELECT pg_catalog.pg_column_size(huge) < 1048576 AND pg_catalog.pg_column_compression(huge) IS NOT NULL
             FROM big_values), 'the column holds the 4.5 MB payload compressed, under 1 MiB');
SELECT throws_ok($$SELECT queue.enqueue(v.huge, 'enq.big') FROM big_values v$$,
                 '54000', 'payload too large', 'a compressed payload from a column is measured uncompressed: 54000');
SELECT lives_ok($$SELECT queue.enqueue(v.fine, 'enq.big') FROM big_values v$$,
                'a compressed payload under 1 MiB uncompressed is accepted');
SELECT throws_ok($$SELECT queue.enqueue('{}', 'enq.big', key => v.long_key) FROM big_values v$$,
                 '22023', NULL, 'a compressed key from a column is measured by its characters: 22023');

SELECT * FROM finish();
ROLLBACK;
