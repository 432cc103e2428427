-- queue.run_schedule_now enqueues a schedule's task at once without moving its timetable, and
-- raises for a NULL or unknown name; schedule(…, overlap => false) makes fire_schedules skip a tick
-- (next_fire moves on, last_fired stays, nothing enqueued) while the task the schedule last
-- enqueued is live in any stage, and fire again once it has ended; with overlap (the default)
-- every tick fires. now() is fixed for the transaction; firing uses injected times in 2030.
BEGIN;
SELECT plan(26);

-- run_schedule_now ------------------------------------------------------------------------------------------------
SELECT queue.schedule('rn.a', '0 3 * * *', stage => 'rn.a', payload => '{"job": "a"}', priority => 4);
CREATE TEMP TABLE before AS SELECT s.next_fire, s.last_fired FROM queue.schedules s WHERE s.name = 'rn.a';
CREATE TEMP TABLE ran AS SELECT queue.run_schedule_now('rn.a') AS id;
SELECT isnt((SELECT id FROM ran), NULL, 'run_schedule_now returns the new task''s id');
SELECT results_eq(
    $$SELECT t.stage, t.payload, t.priority, t.status::text, t.key FROM queue.live_tasks t WHERE t.id = (SELECT id FROM ran)$$,
    $$VALUES ('rn.a'::text, '{"job": "a"}'::jsonb, 4, 'ready'::text,
              'schedule:rn.a:now:' || to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))$$,
    'the task has the schedule''s stage, payload and priority, is ready now, and is keyed schedule:<name>:now:<time>');
SELECT results_eq($$SELECT s.next_fire, s.last_fired FROM queue.schedules s WHERE s.name = 'rn.a'$$,
                  $$SELECT * FROM before$$, 'the timetable does not move (next_fire, last_fired)');
SELECT is((SELECT s.last_task FROM queue.schedules s WHERE s.name = 'rn.a'), (SELECT id FROM ran),
          'the task becomes the schedule''s last_task');
SELECT is(queue.run_schedule_now('rn.a'), (SELECT id FROM ran), 'a second call in the same transaction returns the same task');
SELECT is((SELECT count(*)::integer FROM queue.live_tasks t WHERE t.stage = 'rn.a'), 1, 'and enqueues no second one');

SELECT throws_ok($$SELECT queue.run_schedule_now(NULL)$$, '22004', 'name must not be NULL', 'a NULL name raises 22004');
SELECT throws_ok($$SELECT queue.run_schedule_now('rn.nope')$$, 'P0002', 'no such schedule', 'an unknown name raises P0002');
SELECT throws_like($$SELECT queue.run_schedule_now(repeat('n', 5000))$$, '%no such schedule%', 'a very long unknown name too');
CREATE FUNCTION pg_temp.error_fields(sql text) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE v_detail text; v_hint text;
BEGIN
    EXECUTE sql;
    RETURN NULL;
EXCEPTION WHEN no_data_found THEN
    GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
    RETURN ARRAY[v_detail, v_hint];
END $$;
SELECT is(pg_temp.error_fields($$SELECT queue.run_schedule_now('rn.nope')$$),
          ARRAY['No schedule is named ''rn.nope''.', 'SELECT name FROM queue.schedules lists them; queue.schedule() creates one.'],
          'its DETAIL names the schedule, its HINT says where they are listed');

SELECT queue.unschedule('rn.a');

-- overlap => false ------------------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT queue.schedule('rn.err', '* * * * *', overlap => NULL)$$, '22004', 'overlap must not be NULL',
                 'a NULL overlap raises 22004');
SELECT queue.schedule('rn.solo', '*/5 * * * *', stage => 'rn.solo', overlap => false);
SELECT queue.schedule('rn.many', '*/5 * * * *', stage => 'rn.many');
SELECT is((SELECT array_agg(s.overlap ORDER BY s.name) FROM queue.schedules s WHERE s.name IN ('rn.solo', 'rn.many')),
          ARRAY[true, false], 'overlap is stored; true by default');
UPDATE queue.schedules SET next_fire = '2030-01-01 00:05:00+00' WHERE name IN ('rn.solo', 'rn.many');

SELECT is(queue.fire_schedules('2030-01-01 00:05:00+00'), 2, 'the first tick fires both schedules');
SELECT is(queue.fire_schedules('2030-01-01 00:10:00+00'), 1, 'the next tick, with both tasks still live, fires only the one with overlap');
SELECT results_eq($$SELECT s.next_fire, s.last_fired FROM queue.schedules s WHERE s.name = 'rn.solo'$$,
                  $$VALUES ('2030-01-01 00:15:00+00'::timestamptz, '2030-01-01 00:05:00+00'::timestamptz)$$,
                  'a skipped tick moves next_fire on and leaves last_fired at the tick that fired');
SELECT is((SELECT count(*)::integer FROM queue.live_tasks WHERE stage = 'rn.solo'), 1, 'the schedule without overlap has one task');
SELECT is((SELECT count(*)::integer FROM queue.live_tasks WHERE stage = 'rn.many'), 2, 'the one with overlap has two');

-- Running counts as live; so does a retry waiting, and a task moved on to another stage.
CREATE TEMP TABLE took AS SELECT k.id, k.lease FROM queue.take_next('rn.solo') k;
SELECT is(queue.fire_schedules('2030-01-01 00:15:00+00'), 1, 'a running task still blocks the next tick');
SELECT queue.fail(id, lease, 'boom', retry_in => interval '1 hour') FROM took;
SELECT is(queue.fire_schedules('2030-01-01 00:20:00+00'), 1, 'a task waiting for a retry still blocks it');
DELETE FROM took;
UPDATE queue.live_tasks SET run_at = now() WHERE stage = 'rn.solo';
INSERT INTO took SELECT k.id, k.lease FROM queue.take_next('rn.solo') k;
SELECT queue.finish(id, lease, 'rn.solo.next') FROM took;
SELECT is(queue.fire_schedules('2030-01-01 00:25:00+00'), 1, 'a task moved on to a next stage still blocks it');
SELECT is(queue.run_schedule_now('rn.solo'), NULL, 'run_schedule_now enqueues nothing while it is live, returning NULL');

-- Once the task has ended, the next tick fires.
DELETE FROM took;
INSERT INTO took SELECT k.id, k.lease FROM queue.take_next('rn.solo.next') k;
SELECT queue.finish(id, lease) FROM took;
SELECT is(queue.fire_schedules('2030-01-01 00:30:00+00'), 2, 'after the task ended, the next tick fires again');
SELECT is((SELECT s.last_task FROM queue.schedules s WHERE s.name = 'rn.solo'),
          (SELECT t.id FROM queue.live_tasks t WHERE t.stage = 'rn.solo'), 'and its task is the new last_task');
-- A cancelled task has ended too; run_schedule_now then enqueues, and its task blocks the ticks.
SELECT queue.cancel(t.id) FROM queue.live_tasks t WHERE t.stage = 'rn.solo';
CREATE TEMP TABLE ran2 AS SELECT queue.run_schedule_now('rn.solo') AS id;
SELECT isnt((SELECT id FROM ran2), NULL, 'after a cancel, run_schedule_now enqueues');
SELECT is(queue.fire_schedules('2030-01-01 00:35:00+00'), 1, 'and its task blocks the next tick as a tick''s would');
-- Replacing the schedule keeps its last task.
SELECT queue.schedule('rn.solo', '*/5 * * * *', stage => 'rn.solo', overlap => false);
SELECT is((SELECT s.last_task FROM queue.schedules s WHERE s.name = 'rn.solo'), (SELECT id FROM ran2),
          'replacing a schedule keeps its last_task');

SELECT * FROM finish();
ROLLBACK;
