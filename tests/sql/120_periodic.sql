-- Periodic tasks (repeat, drift): finishing a run records it in queue.history and re-arms the same
-- task. With drift the next run is the first slot + k * repeat after the finish (missed slots are
-- skipped, never caught up); without drift it is the finish time + repeat. Retries do not shift
-- the schedule; a fatal run is recorded and the schedule goes on; cancel ends it.
-- now() is fixed for the transaction: slots are set in the past relative to it (by run_at at
-- enqueue, or as superuser), and every expected time is written in terms of now().
BEGIN;
SELECT plan(60);

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);

-- Drift (default): three slots missed, the next run is the first slot after now ---------------------
INSERT INTO made VALUES ('d', queue.enqueue('{"job": "d"}', 'pd.d', run_at => now() - interval '3 hours 10 minutes',
                                            repeat => interval '1 hour', group_key => 'tenant-d'));
INSERT INTO took SELECT 'd1', k.* FROM queue.take_next('pd.d', worker => 'w-d') k;
SELECT is((SELECT id FROM took WHERE name = 'd1'), (SELECT id FROM made WHERE name = 'd'), 'setup: the periodic task is taken');
SELECT is(queue.finish(id, lease), true, 'finish of a periodic run returns true') FROM took WHERE name = 'd1';
SELECT results_eq(
    $$SELECT t.status::text, t.attempt, t.run_at, t.slot, t.lease, t.lease_expires, t.started, t.worker, t.error_text, t.repeat, t.drift
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'd')$$,
    $$VALUES ('ready'::text, 0, now() + interval '50 minutes', now() + interval '50 minutes', NULL::uuid, NULL::timestamptz,
              NULL::timestamptz, NULL::text, NULL::text, interval '1 hour', true)$$,
    'drift: slot now-3h10m, repeat 1h: the three missed slots are skipped, the next run is slot + 4h = now + 50 min; ready, attempt 0, no lease'
);
SELECT results_eq(
    $$SELECT h.status::text, h.stage, h.run_at, h.attempt, h.worker, h.finished, h.payload, h.group_key
        FROM queue.history h WHERE h.id = (SELECT id FROM made WHERE name = 'd')$$,
    $$VALUES ('done'::text, 'pd.d'::text, now() - interval '3 hours 10 minutes', 1, 'w-d'::text, now(), '{"job": "d"}'::jsonb, 'tenant-d'::text)$$,
    'the run is one done row in queue.history, with its planned time, attempt, worker and group_key'
);
SELECT is_empty($$SELECT * FROM queue.take_next('pd.d')$$, 'the re-armed task is not due before its next slot');
SELECT is(queue.finish(id, lease), false, 'the finished run''s lease no longer counts') FROM took WHERE name = 'd1';
SELECT is((SELECT count(*)::integer FROM queue.history WHERE id = (SELECT id FROM made WHERE name = 'd')), 1,
          'the stale finish wrote no second history row');

-- A finish exactly on a slot: the next run is strictly after now ------------------------------------------
INSERT INTO made VALUES ('edge', queue.enqueue('{}', 'pd.edge', run_at => now() - interval '2 hours', repeat => interval '1 hour'));
SELECT is(queue.finish(k.id, k.lease), true, 'setup: a run planned exactly 2 repeats ago finishes') FROM queue.take_next('pd.edge') k;
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'edge')), now() + interval '1 hour',
          'drift: a slot equal to now is taken as passed; the next run is now + repeat, never now');

-- A run that ends before its next slot: the next slot, no skipping ----------------------------------------
INSERT INTO made VALUES ('on', queue.enqueue('{}', 'pd.on', run_at => now() - interval '5 minutes', repeat => interval '1 hour'));
SELECT is(queue.finish(k.id, k.lease), true, 'setup: a run 5 minutes late finishes') FROM queue.take_next('pd.on') k;
SELECT is((SELECT run_at FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'on')), now() + interval '55 minutes',
          'drift: the next run is the slot after the one just run (slot + 1h), keeping the schedule''s phase');

-- No drift: from the end of the run ---------------------------------------------------------------------
INSERT INTO made VALUES ('nd', queue.enqueue('{}', 'pd.nd', run_at => now() - interval '3 hours 10 minutes',
                                             repeat => interval '1 hour', drift => false));
SELECT is(queue.finish(k.id, k.lease), true, 'setup: a run without drift finishes') FROM queue.take_next('pd.nd') k;
SELECT results_eq(
    $$SELECT t.run_at, t.slot FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'nd')$$,
    $$VALUES (now() + interval '1 hour', now() + interval '1 hour')$$,
    'no drift: the next run is the finish time + repeat, whatever the slot was'
);

-- Retries do not shift a drifting schedule ------------------------------------------------------------------
INSERT INTO made VALUES ('r', queue.enqueue('{}', 'pd.r', run_at => now() - interval '10 minutes', repeat => interval '1 hour'));
INSERT INTO took SELECT 'r1', k.* FROM queue.take_next('pd.r') k;
SELECT is(queue.fail(id, lease, 'transient', retry_in => interval '0'), true, 'setup: the first attempt fails, retry due now')
  FROM took WHERE name = 'r1';
SELECT results_eq(
    $$SELECT t.status::text, t.run_at, t.slot FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'r')$$,
    $$VALUES ('error'::text, now(), now() - interval '10 minutes')$$,
    'a retry moves run_at, not the slot'
);
INSERT INTO took SELECT 'r2', k.* FROM queue.take_next('pd.r') k;
SELECT is((SELECT attempt FROM took WHERE name = 'r2'), 2, 'setup: the retry is taken as attempt 2');
SELECT is(queue.finish(id, lease), true, 'the retried run finishes') FROM took WHERE name = 'r2';
SELECT results_eq(
    $$SELECT t.run_at, t.attempt, t.error_text FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'r')$$,
    $$VALUES (now() + interval '50 minutes', 0, NULL::text)$$,
    'drift after a retry: the next run is slot + 1h (now + 50 min), not retry time + 1h; attempts and error start over'
);
SELECT results_eq(
    $$SELECT h.status::text, h.attempt, h.error_text FROM queue.history h WHERE h.id = (SELECT id FROM made WHERE name = 'r')$$,
    $$VALUES ('done'::text, 2, 'transient'::text)$$,
    'the run''s history row keeps its two attempts and the error of the first'
);

-- Many runs: the same id, a history row per run ------------------------------------------------------------
INSERT INTO made VALUES ('m', queue.enqueue('{"job": "m"}', 'pd.m', key => 'every-minute', run_at => now() - interval '1 minute',
                                            repeat => interval '1 minute', drift => false));
SELECT is(queue.finish(k.id, k.lease), true, 'run 1 finishes') FROM queue.take_next('pd.m') k;
UPDATE queue.live_tasks SET run_at = now(), slot = now() WHERE id = (SELECT id FROM made WHERE name = 'm');  -- as superuser: due again
SELECT is(queue.finish(k.id, k.lease), true, 'run 2 finishes') FROM queue.take_next('pd.m') k;
UPDATE queue.live_tasks SET run_at = now(), slot = now() WHERE id = (SELECT id FROM made WHERE name = 'm');  -- as superuser: due again
SELECT results_eq(
    $$SELECT k.id, k.attempt, k.key FROM queue.take_next('pd.m') k$$,
    $$SELECT id, 1, 'every-minute'::text FROM made WHERE name = 'm'$$,
    'run 3 is the same task (same id and key), at attempt 1 again'
);
SELECT is((SELECT count(*)::integer FROM queue.history WHERE id = (SELECT id FROM made WHERE name = 'm') AND status = 'done'), 2,
          'two finished runs are two done rows in queue.history');
SELECT is((SELECT count(*)::integer FROM queue.live_tasks WHERE stage = 'pd.m'), 1, 'and there is still exactly one live row');
SELECT is(queue.enqueue('{"job": "m"}', 'pd.m', key => 'every-minute', repeat => interval '1 minute'),
          (SELECT id FROM made WHERE name = 'm'),
          'enqueue with the key again (mode ignore) returns the scheduled task: registering a schedule is idempotent');
SELECT results_eq(
    $$SELECT status::text, repeat FROM queue.tasks WHERE id = (SELECT id FROM made WHERE name = 'm') ORDER BY finished NULLS LAST$$,
    $$VALUES ('done'::text, NULL::interval), ('done', NULL), ('running', interval '1 minute')$$,
    'queue.tasks shows the runs (repeat NULL in history) and the live row with its repeat'
);

-- finish_batch: periodic and one-off tasks in one batch ---------------------------------------------------
INSERT INTO made VALUES ('bp', queue.enqueue('{}', 'pd.b', run_at => now() - interval '90 minutes', repeat => interval '1 hour'));
INSERT INTO made VALUES ('bo', queue.enqueue('{}', 'pd.b', run_at => now() - interval '1 minute'));
CREATE TEMP TABLE took_b AS SELECT * FROM queue.take_next('pd.b', batch => 2);
SELECT is(queue.finish_batch(array_agg(id ORDER BY id), array_agg(lease ORDER BY id)), 2,
          'finish_batch counts a periodic and a one-off task among the attempts it ended')
  FROM took_b;
SELECT results_eq(
    $$SELECT t.status::text, t.run_at, t.attempt FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'bp')$$,
    $$VALUES ('ready'::text, now() + interval '30 minutes', 0)$$,
    'finish_batch re-arms the periodic task at its next slot (slot now-90min + 2h = now + 30 min)'
);
SELECT results_eq(
    $$SELECT h.id, h.status::text FROM queue.history h WHERE h.stage = 'pd.b' ORDER BY h.id$$,
    $$SELECT id, 'done'::text FROM made WHERE name IN ('bp', 'bo') ORDER BY id$$,
    'both runs have a done row; the one-off task left queue.live_tasks'
);
SELECT is(queue.finish_batch(array_agg(id ORDER BY id), array_agg(lease ORDER BY id)), 0,
          'the same batch again ends nothing')
  FROM took_b;
INSERT INTO made VALUES ('bt', queue.enqueue('{}', 'pd.bt', run_at => now() - interval '1 minute', repeat => interval '1 hour'));
SELECT is(queue.finish_batch(ARRAY[k.id, k.id], ARRAY[k.lease, k.lease]), 1, 'a periodic pair given twice is finished once')
  FROM queue.take_next('pd.bt') k;
SELECT is((SELECT count(*)::integer FROM queue.history WHERE id = (SELECT id FROM made WHERE name = 'bt')), 1,
          'a periodic pair given twice writes one history row');

-- A fatal run is recorded, the schedule goes on ------------------------------------------------------------
INSERT INTO made VALUES ('f', queue.enqueue('{}', 'pd.f', run_at => now() - interval '30 minutes', repeat => interval '1 hour'));
INSERT INTO took SELECT 'f', k.* FROM queue.take_next('pd.f', worker => 'w-f') k;
SELECT is(queue.fail(id, lease, 'bad input', fatal => true), true, 'fail(fatal => true) of a periodic run returns true')
  FROM took WHERE name = 'f';
SELECT results_eq(
    $$SELECT h.status::text, h.error_text, h.attempt, h.worker FROM queue.history h WHERE h.id = (SELECT id FROM made WHERE name = 'f')$$,
    $$VALUES ('fatal'::text, 'bad input'::text, 1, 'w-f'::text)$$,
    'the fatal run is a fatal row in queue.history with its error'
);
SELECT results_eq(
    $$SELECT t.status::text, t.attempt, t.run_at, t.error_text, t.lease FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'f')$$,
    $$VALUES ('ready'::text, 0, now() + interval '30 minutes', NULL::text, NULL::uuid)$$,
    'the task is re-armed for its next slot, from attempt 0, its error cleared: one bad run does not end a schedule'
);
SELECT is(queue.fail(id, lease, 'again', fatal => true), false, 'failing the fatal run again returns false')
  FROM took WHERE name = 'f';
SELECT results_eq(
    $$SELECT error, tasks FROM queue.errors WHERE stage = 'pd.f'$$,
    $$VALUES ('bad input'::text, 1::bigint)$$,
    'queue.errors counts the fatal run'
);

-- Out of attempts: the same as fatal.
DO $$ BEGIN PERFORM queue.configure_stage('pd.max', max_attempts => 1); END $$;
INSERT INTO made VALUES ('x', queue.enqueue('{}', 'pd.max', run_at => now() - interval '1 minute', repeat => interval '1 day', drift => false));
SELECT is(queue.fail(k.id, k.lease, 'out of attempts'), true, 'the only attempt of a periodic run fails') FROM queue.take_next('pd.max') k;
SELECT results_eq(
    $$SELECT (SELECT h.status::text FROM queue.history h WHERE h.id = t.id), t.status::text, t.run_at, t.attempt
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'x')$$,
    $$VALUES ('fatal'::text, 'ready'::text, now() + interval '1 day', 0)$$,
    'a periodic run out of attempts is fatal in history and the task is re-armed (no drift: now + repeat)'
);

-- reap_hung: an expired periodic run out of attempts is fatal, the task re-armed.
INSERT INTO made VALUES ('h', queue.enqueue('{}', 'pd.max', run_at => now() - interval '1 minute', repeat => interval '1 hour'));
INSERT INTO took SELECT 'h', k.* FROM queue.take_next('pd.max', worker => 'w-h') k;
UPDATE queue.live_tasks SET lease_expires = now() - interval '1 second' WHERE id = (SELECT id FROM made WHERE name = 'h');  -- as superuser
SELECT is(queue.reap_hung(), 1, 'reap_hung counts the expired periodic run');
SELECT results_eq(
    $$SELECT h.status::text, h.error_text LIKE 'lease expired%', h.worker FROM queue.history h WHERE h.id = (SELECT id FROM made WHERE name = 'h')$$,
    $$VALUES ('fatal'::text, true, 'w-h'::text)$$,
    'the expired run is fatal in history with the lease expired error'
);
SELECT results_eq(
    $$SELECT t.status::text, t.run_at, t.attempt, t.lease FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'h')$$,
    $$VALUES ('ready'::text, now() + interval '59 minutes', 0, NULL::uuid)$$,
    'the reaped periodic task is re-armed at its next slot'
);

-- A periodic task cannot move to another stage ------------------------------------------------------------
INSERT INTO made VALUES ('p', queue.enqueue('{}', 'pd.p', run_at => now() - interval '1 minute', repeat => interval '1 hour'));
INSERT INTO took SELECT 'p', k.* FROM queue.take_next('pd.p') k;
SELECT throws_ok(format('SELECT queue.finish(%s, %L, next_stage => %L)', id, lease, 'pd.next'),
                 '22023', 'a periodic task cannot move to another stage',
                 'finish(next_stage => …) of a periodic task raises 22023')
  FROM took WHERE name = 'p';
SELECT results_eq(
    $$SELECT t.stage, t.status::text, t.lease FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'p')$$,
    $$SELECT 'pd.p'::text, 'running'::text, lease FROM took WHERE name = 'p'$$,
    'after 22023 the task still runs in its stage under its lease'
);
SELECT is(queue.finish(id, gen_random_uuid(), next_stage => 'pd.next'), false,
          'finish(next_stage => …) with a stale lease of a periodic task returns false, it does not raise')
  FROM took WHERE name = 'p';
SELECT is(queue.finish(id, lease), true, 'without next_stage the run finishes') FROM took WHERE name = 'p';

-- Re-run while a periodic run is running: the re-run comes first, no history row.
INSERT INTO made VALUES ('rr', queue.enqueue('{"v": 1}', 'pd.rr', key => 'rr', run_at => now() - interval '1 minute', repeat => interval '1 hour'));
INSERT INTO took SELECT 'rr', k.* FROM queue.take_next('pd.rr') k;
SELECT is(queue.enqueue('{"v": 2}', 'pd.rr', key => 'rr', mode => 'rerun', repeat => interval '1 hour'), id,
          'setup: a rerun enqueue of the running periodic task') FROM made WHERE name = 'rr';
SELECT is(queue.finish(id, lease), true, 'its finish returns true') FROM took WHERE name = 'rr';
SELECT results_eq(
    $$SELECT t.status::text, t.run_at, t.slot, t.payload, (SELECT count(*)::integer FROM queue.history h WHERE h.id = t.id)
        FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'rr')$$,
    $$VALUES ('ready'::text, now(), now(), '{"v": 2}'::jsonb, 0)$$,
    'the re-run runs now with the new payload (a new slot), without a done row, as for any re-run task'
);

-- cancel ends the schedule; retry brings back one run ---------------------------------------------------------
-- As superuser: date the finished run back, so that the cancel is its last history row (now() is
-- the same for every statement of this transaction).
UPDATE queue.history SET finished = now() - interval '1 hour' WHERE id = (SELECT id FROM made WHERE name = 'd');
SELECT lives_ok(format('SELECT queue.cancel(%s)', id), 'cancel of a re-armed periodic task succeeds') FROM made WHERE name = 'd';
SELECT is_empty($$SELECT 1 FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = 'd')$$,
                'a cancelled periodic task has no live row: the schedule has ended');
SELECT results_eq(
    $$SELECT status::text, group_key FROM queue.history WHERE id = (SELECT id FROM made WHERE name = 'd') ORDER BY status$$,
    $$VALUES ('cancelled'::text, 'tenant-d'::text), ('done', 'tenant-d')$$,
    'its history keeps the finished run and adds the cancelled row, both with the group_key'
);
SELECT lives_ok(format('SELECT queue.retry(%s)', id), 'retry of the cancelled periodic task succeeds') FROM made WHERE name = 'd';
SELECT results_eq(
    $$SELECT t.status::text, t.repeat, t.slot, t.group_key FROM queue.live_tasks t WHERE t.id = (SELECT id FROM made WHERE name = 'd')$$,
    $$VALUES ('ready'::text, NULL::interval, NULL::timestamptz, 'tenant-d'::text)$$,
    'retry brings it back as a one-off run with its group_key (the schedule is not kept in history)'
);

-- The arithmetic of _next_slot against a brute-force search, with months and DST ---------------------------
-- In UTC whatever the session's TimeZone (here Europe/Berlin, whose DST changes the cases cross).
SET LOCAL TimeZone = 'Europe/Berlin';
CREATE TEMP TABLE cases (slot timestamptz, repeat interval, finished timestamptz);
INSERT INTO cases VALUES
    ('2024-01-31 10:00', interval '1 month', '2024-06-15 12:00'),
    ('2024-01-31 10:00', interval '1 month', '2024-02-29 10:00'),
    ('2024-03-30 02:30', interval '1 day', '2024-04-02 01:00'),
    ('2024-10-26 02:30', interval '1 day', '2024-10-28 03:00'),
    ('2024-03-31 01:00', interval '1 hour', '2024-03-31 05:30'),
    ('2024-01-01 00:00', interval '1 second', '2024-01-02 00:00:00.5'),
    ('2020-02-29 00:00', interval '1 year', '2024-02-28 23:59'),
    ('2024-01-01 00:00', interval '1 mon 2 days 03:04:05', '2030-07-07 07:07'),
    ('2024-05-01 00:00', interval '1 hour', '2024-04-01 00:00');
SELECT results_eq(
    $$SELECT queue._next_slot(c.slot, c.repeat, true, c.finished) FROM cases c ORDER BY c.slot, c.repeat, c.finished$$,
    $$SELECT (SELECT min(((c.slot AT TIME ZONE 'UTC') + k * c.repeat) AT TIME ZONE 'UTC')
                FROM generate_series(1, 100000) AS k
               WHERE ((c.slot AT TIME ZONE 'UTC') + k * c.repeat) AT TIME ZONE 'UTC' > c.finished)
        FROM cases c ORDER BY c.slot, c.repeat, c.finished$$,
    'with drift the next slot is the smallest slot + k * repeat (k >= 1) in UTC after the finish: months, leap days, fine repeats, a future slot; the session''s DST does not count'
);
SELECT is(queue._next_slot('2024-01-01 00:00', interval '1 hour', false, '2024-06-01 12:34'), '2024-06-01 13:34'::timestamptz,
          'without drift the next run is the finish + repeat');
SELECT is(queue._next_slot('2026-07-01 07:00+00', interval '1 day', true, '2026-11-24 12:00+00'), '2026-11-25 07:00+00',
          'a daily slot at 07:00 UTC stays at 07:00 UTC across the session''s (Berlin''s) DST change: a day is 24 hours');
SELECT is(queue._next_slot('2026-07-01 07:00+00', interval '1 day', false, '2026-10-24 12:00+00'), '2026-10-25 12:00+00',
          'without drift too: the finish + 24 hours over the night Berlin''s clocks go back');
SELECT is(queue._next_slot('2027-01-31 09:00+00', interval '1 month', true, '2027-01-31 09:05+00'), '2027-02-28 09:00+00',
          'a month from 31 January is clamped to 28 February');
SELECT is(queue._next_slot('2027-02-28 09:00+00', interval '1 month', true, '2027-02-28 09:05+00'), '2027-03-28 09:00+00',
          'and the slot stored then stays on the 28th: a monthly repeat keeps the clamped day (documented)');

SELECT * FROM finish();
ROLLBACK;
