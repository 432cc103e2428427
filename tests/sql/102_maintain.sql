-- queue.maintain: reaps hung tasks, fires due schedules, rotates history partitions when rotate_every has passed (and
-- not again before), writes nothing when nothing is due, returns a row per task.
-- Many sessions at once (one rotates, the others go on) is in tests/py/test_rotation_under_load.py.
BEGIN;
SELECT plan(25);

-- A known start: no dated partition, never rotated.
DO $$
DECLARE
    v record;
BEGIN
    FOR v IN SELECT h.schema, h.name FROM queue._history_partitions() h LOOP
        EXECUTE format('DROP TABLE %I.%I', v.schema, v.name);
    END LOOP;
    UPDATE queue.history_policy SET last_rotated = NULL;
    -- Rolled up past the times below (the rollup's own steps: 093_hourly_rollup.sql).
    UPDATE queue.finished_hours_clock SET rolled_to = '2030-06-15 13:00+00';
END
$$;

-- Due (never rotated): reaps and rotates ------------------------------------------------------------------------
CREATE TEMP TABLE m1 AS SELECT * FROM queue.maintain('2030-06-15 12:00+00');
SELECT results_eq($$SELECT task FROM m1$$, $$VALUES ('reap_hung'), ('fire_schedules'), ('roll_up_hours'), ('rotate_partitions'), ('stage_waiters'), ('finished_counts'), ('compact')$$,
                  'maintain returns a row per task: reap_hung, fire_schedules, roll_up_hours, rotate_partitions, stage_waiters, finished_counts, then compact');
SELECT results_eq($$SELECT count, detail FROM m1 WHERE task = 'reap_hung'$$, $$VALUES (0, 'no expired lease')$$,
                  'with no expired lease, reap_hung reports 0');
SELECT is((SELECT count FROM m1 WHERE task = 'rotate_partitions'), 8,
          'never rotated: it rotates, and counts the 8 partitions created (the day and 7 ahead)');
SELECT ok((SELECT detail LIKE 'created queue.history_20300615; created queue.history_20300616; %' FROM m1 WHERE task = 'rotate_partitions'),
          'the rotate_partitions row lists what was done');
SELECT is((SELECT count(*)::integer FROM queue._history_partitions()), 8, 'the partitions exist');
SELECT is((SELECT last_rotated FROM queue.history_policy), '2030-06-15 12:00+00'::timestamptz,
          'last_rotated is the now it rotated at');

-- Not due: no rotation, no write at all ---------------------------------------------------------------------------
CREATE TEMP TABLE policy_row AS SELECT ctid AS row_at FROM queue.history_policy;
CREATE TEMP TABLE m2 AS SELECT * FROM queue.maintain('2030-06-15 12:09:59+00');
SELECT results_eq($$SELECT task, count FROM m2$$, $$VALUES ('reap_hung', 0), ('fire_schedules', 0), ('roll_up_hours', 0), ('rotate_partitions', 0), ('stage_waiters', 0), ('finished_counts', 0), ('compact', 0)$$,
                  'within rotate_every of the last rotation, nothing is done');
SELECT ok((SELECT detail LIKE 'not due: last rotated at %, next after %' FROM m2 WHERE task = 'rotate_partitions'),
          'and the row says when the next rotation is due');
SELECT is((SELECT ctid FROM queue.history_policy), (SELECT row_at FROM policy_row),
          'a call with nothing due writes nothing (the policy row was not updated)');
SELECT is((SELECT last_rotated FROM queue.history_policy), '2030-06-15 12:00+00'::timestamptz, 'last_rotated is unchanged');

-- Due again once rotate_every has passed ---------------------------------------------------------------------------
SELECT results_eq($$SELECT count, detail FROM queue.maintain('2030-06-15 12:10+00') WHERE task = 'rotate_partitions'$$,
                  $$VALUES (0, 'nothing to do')$$,
                  'rotate_every (10 minutes) after the last rotation it rotates again; nothing to do is said so');
SELECT is((SELECT last_rotated FROM queue.history_policy), '2030-06-15 12:10+00'::timestamptz, 'last_rotated moves on');
SELECT results_eq($$SELECT count, detail FROM queue.maintain('2030-06-16 00:00+00') WHERE task = 'rotate_partitions'$$,
                  $$VALUES (1, 'created queue.history_20300623')$$,
                  'the next day it creates the one new partition ahead');
SELECT lives_ok($$SELECT queue.configure_history(rotate_every => '1 hour')$$, 'setup: rotate_every 1 hour');
SELECT results_eq($$SELECT count, detail LIKE 'not due:%' FROM queue.maintain('2030-06-16 00:59:59+00') WHERE task = 'rotate_partitions'$$,
                  $$VALUES (0, true)$$,
                  'rotate_every is read from history_policy');
SELECT results_eq($$SELECT count FROM queue.maintain('2030-06-10 00:00+00') WHERE task = 'rotate_partitions'$$,
                  $$VALUES (5)$$,
                  'a last_rotated in the future (clock moved back) counts as due: it rotates (creating 2030-06-10 to 06-14)');

-- Reaping ------------------------------------------------------------------------------------------------------------
CREATE TEMP TABLE hung AS SELECT queue.enqueue('{"n": 1}', 'mt.s') AS id;
SELECT is((SELECT count(*)::integer FROM queue.take_next('mt.s')), 1, 'setup: the task is taken');
UPDATE queue.live_tasks SET lease_expires = now() - interval '1 second' WHERE id = (SELECT id FROM hung);
SELECT results_eq($$SELECT count, detail FROM queue.maintain('2030-06-10 00:10+00') WHERE task = 'reap_hung'$$,
                  $$VALUES (1, '1 tasks with an expired lease recovered')$$,
                  'maintain reaps a task whose lease expired and counts it');
SELECT is((SELECT status::text FROM queue.live_tasks WHERE id = (SELECT id FROM hung)), 'error',
          'the reaped task waits for its retry');

-- Schedules: a due tick is fired once, through maintain --------------------------------------------------------------
SELECT queue.schedule('mt.every5', '*/5 * * * *', stage => 'mt.cron');
UPDATE queue.schedules SET next_fire = '2030-06-20 10:05+00' WHERE name = 'mt.every5';
SELECT results_eq($$SELECT count, detail FROM queue.maintain('2030-06-20 10:06+00') WHERE task = 'fire_schedules'$$,
                  $$VALUES (1, '1 scheduled tasks enqueued')$$,
                  'maintain fires a due schedule and counts the task it enqueued');
SELECT results_eq($$SELECT count FROM queue.maintain('2030-06-20 10:07+00') WHERE task = 'fire_schedules'$$,
                  $$VALUES (0)$$,
                  'the same tick is not fired again');

-- Errors and roles ------------------------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT * FROM queue.maintain(NULL)$$, '22004', 'now must not be NULL', 'maintain(NULL) raises 22004');
SET LOCAL ROLE skiplock_worker;
SELECT throws_ok($$SELECT * FROM queue.maintain()$$, '42501', 'permission denied for function maintain',
                 'skiplock_worker may not run maintain (42501)');
SELECT ok((SELECT pg_catalog.count(*) > 0 FROM queue.maintain_now()),
          'skiplock_worker may run maintain_now, which runs maintain as of now (its rows)');
RESET ROLE;
SET LOCAL ROLE skiplock_admin;
SELECT lives_ok($$SELECT * FROM queue.maintain()$$, 'skiplock_admin may run maintain');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
