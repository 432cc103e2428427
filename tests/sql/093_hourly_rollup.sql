-- The hourly rollup (queue.finished_hours, filled by maintain() through _roll_up_hours) and what
-- reads it: queue.hourly counts the same runs as history across an hour boundary, closed hours from
-- the rollup and the later ones from history; a finish that commits within the margin after its
-- hour is counted; a second call adds nothing; rows older than 8 days go; restricted stages stay
-- hidden from a monitor. Also queue.live_counts (exact, sampled, hidden stages) and queue.workers.
BEGIN;
SELECT plan(29);

-- A known start: nothing rolled up, no history. T: the start of a UTC hour three hours ago (the
-- view shows the last 7 days as of now()).
DELETE FROM queue.finished_hours;
UPDATE queue.finished_hours_clock SET rolled_to = NULL;
TRUNCATE queue.history;
CREATE TEMP TABLE t0 AS SELECT pg_catalog.date_trunc('hour', now(), 'UTC') - interval '3 hours' AS t;
GRANT SELECT ON t0 TO PUBLIC;
CREATE TEMP SEQUENCE ids;
CREATE FUNCTION pg_temp.run(p_stage text, p_status queue.task_status, p_finished timestamptz, p_took interval)
    RETURNS void LANGUAGE sql AS $$
    INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished)
    VALUES (nextval('pg_temp.ids'), p_stage, p_status, 0, p_finished - interval '1 minute', '{}', 1,
            p_finished - interval '1 minute', p_finished - p_took, p_finished)
$$;
-- Hour 1 (T): three done (one at its first instant, one at its last), one fatal. Hour 2 (T + 1 h):
-- two done (one at its first instant), one cancelled before it was ever taken (no start).
SELECT pg_temp.run('s.one', 'done', t, interval '2 seconds') FROM t0;
SELECT pg_temp.run('s.one', 'done', t + interval '30 minutes', interval '4 seconds') FROM t0;
SELECT pg_temp.run('s.one', 'done', t + interval '1 hour' - interval '1 microsecond', interval '6 seconds') FROM t0;
SELECT pg_temp.run('s.one', 'fatal', t + interval '10 minutes', interval '1 second') FROM t0;
SELECT pg_temp.run('s.one', 'done', t + interval '1 hour', interval '1 second') FROM t0;
SELECT pg_temp.run('s.one', 'done', t + interval '90 minutes', interval '3 seconds') FROM t0;
SELECT pg_temp.run('s.one', 'cancelled', t + interval '100 minutes', NULL) FROM t0;

-- What the view shows must equal a count of history itself, whatever is rolled up.
CREATE FUNCTION pg_temp.from_history() RETURNS TABLE (hour timestamptz, finished bigint, done bigint, fatal bigint, cancelled bigint, total interval)
    LANGUAGE sql AS $$
    SELECT pg_catalog.date_trunc('hour', h.finished, 'UTC'), count(*), count(*) FILTER (WHERE h.status = 'done'),
           count(*) FILTER (WHERE h.status = 'fatal'), count(*) FILTER (WHERE h.status = 'cancelled'),
           sum(h.finished - h.started)
      FROM queue.history h WHERE h.stage = 's.one' GROUP BY 1
$$;
CREATE FUNCTION pg_temp.from_view() RETURNS TABLE (hour timestamptz, finished bigint, done bigint, fatal bigint, cancelled bigint, total interval)
    LANGUAGE sql AS $$
    SELECT v.hour, v.finished, v.done, v.fatal, v.cancelled, v.total_run_time FROM queue.hourly v WHERE v.stage = 's.one'
$$;

SELECT set_eq('SELECT * FROM pg_temp.from_view()', 'SELECT * FROM pg_temp.from_history()',
              'nothing rolled up yet: queue.hourly counts history itself, hour by hour');
SELECT results_eq($$SELECT v.finished, v.done, v.fatal, v.cancelled, v.total_run_time, v.avg_run_time
                      FROM queue.hourly v, t0 WHERE v.stage = 's.one' ORDER BY v.hour$$,
                  $$VALUES (4::bigint, 3::bigint, 1::bigint, 0::bigint, interval '13 seconds', interval '3.25 seconds'),
                           (3, 2, 0, 1, interval '4 seconds', interval '2 seconds')$$,
                  'the last instant of an hour counts in it, the first of the next in the next; avg_run_time leaves out a run never started');

-- The first call rolls up every closed hour of the last 8 days, up to the one that ended 10 minutes ago.
SELECT is(queue._roll_up_hours(t + interval '1 hour' + interval '9 minutes 59 seconds'), 192,
          'first call, 9 min 59 s after hour 1 ended: the 192 hours before hour 1 (8 days), not hour 1 (within the margin)') FROM t0;
SELECT is((SELECT rolled_to FROM queue.finished_hours_clock), t, 'the clock stops at hour 1') FROM t0;
SELECT is((SELECT count(*)::integer FROM queue.finished_hours), 0, 'those hours had no runs: no rows');

-- A finish of hour 1 that commits within the margin (its row carries its transaction's start).
SELECT pg_temp.run('s.one', 'done', t + interval '59 minutes', interval '5 seconds') FROM t0;
SELECT is(queue._roll_up_hours(t + interval '1 hour' + interval '10 minutes'), 1,
          '10 minutes after hour 1 ended, it is rolled up') FROM t0;
SELECT results_eq($$SELECT f.status::text, f.runs, f.timed, f.run_time FROM queue.finished_hours f, t0
                     WHERE f.stage = 's.one' AND f.hour = t0.t ORDER BY 1$$,
                  $$VALUES ('done', 4::bigint, 4::bigint, interval '17 seconds'), ('fatal', 1, 1, interval '1 second')$$,
                  'hour 1 in the rollup: the late commit within the margin counted');
SELECT is((SELECT rolled_to FROM queue.finished_hours_clock), t + interval '1 hour', 'the clock moves to hour 2') FROM t0;
SELECT set_eq('SELECT * FROM pg_temp.from_view()', 'SELECT * FROM pg_temp.from_history()',
              'hour 1 from the rollup, hour 2 from history: the same counts as history');

-- Again: nothing due, nothing written; and an hour rolled up twice adds nothing.
CREATE TEMP TABLE before AS SELECT * FROM queue.finished_hours;
SELECT is(queue._roll_up_hours(t + interval '1 hour' + interval '30 minutes'), 0, 'a second call within the hour does nothing') FROM t0;
UPDATE queue.finished_hours_clock SET rolled_to = (SELECT t FROM t0);
SELECT is(queue._roll_up_hours(t + interval '1 hour' + interval '10 minutes'), 1, 'with the clock set back, hour 1 is rolled up again…') FROM t0;
SELECT set_eq('SELECT * FROM queue.finished_hours', 'SELECT * FROM before', '…and the rollup is unchanged (no double count)');

-- A finish that commits after its hour was rolled up is not counted (the margin is the bound).
SELECT pg_temp.run('s.one', 'done', t + interval '20 minutes', interval '1 second') FROM t0;
SELECT is((SELECT v.done FROM queue.hourly v, t0 WHERE v.stage = 's.one' AND v.hour = t0.t), 4::bigint,
          'a run of hour 1 committed after the rollup is left out of queue.hourly (history still has it)');
DELETE FROM queue.history WHERE finished = (SELECT t + interval '20 minutes' FROM t0);

-- maintain() runs the step before rotating.
SELECT results_eq($$SELECT m.count, m.detail FROM t0, queue.maintain(t0.t + interval '2 hours' + interval '10 minutes') m
                     WHERE m.task = 'roll_up_hours'$$,
                  $$VALUES (1, '1 hours of history rolled up into finished_hours')$$, 'maintain() rolls up hour 2 once it is due');
SELECT is((SELECT string_agg(task, ',' ORDER BY n) FROM t0, queue.maintain(t0.t + interval '2 hours' + interval '11 minutes') WITH ORDINALITY AS m(task, count, detail, n)),
          'reap_hung,fire_schedules,roll_up_hours,rotate_partitions,stage_waiters,compact', 'the step comes before rotation');
SELECT set_eq('SELECT * FROM pg_temp.from_view()', 'SELECT * FROM pg_temp.from_history()',
              'both hours from the rollup: still the same counts as history');
SELECT is((SELECT count(*)::integer FROM queue.finished_hours f, t0 WHERE f.hour = t0.t + interval '1 hour'), 2,
          'hour 2 in the rollup: done and cancelled');

-- Bounded: rows older than 8 days go as later hours are rolled up.
SELECT ok(queue._roll_up_hours(t + interval '8 days' + interval '1 hour' + interval '10 minutes') > 0, 'eight days later, rolled up again') FROM t0;
SELECT is((SELECT count(*)::integer FROM queue.finished_hours f, t0 WHERE f.hour = t0.t), 0, 'hour 1, now 8 days old, is deleted');
SELECT is((SELECT count(*)::integer FROM queue.finished_hours f, t0 WHERE f.hour = t0.t + interval '1 hour'), 2, 'hour 2 is kept');

-- Restricted stages: hidden from a monitor not granted, in the rollup's rows too.
DELETE FROM queue.finished_hours;
UPDATE queue.finished_hours_clock SET rolled_to = NULL;
SELECT pg_temp.run('r.jobs', 'done', t + interval '5 minutes', interval '1 second') FROM t0;
SELECT pg_temp.run('r.jobs', 'done', t + interval '65 minutes', interval '1 second') FROM t0;
SELECT queue.grant_stage('r.jobs', 'skiplock_admin');
CREATE ROLE skiplock_t_watcher LOGIN IN ROLE skiplock_monitor;
SELECT is(queue._roll_up_hours(t + interval '1 hour' + interval '10 minutes'), 192, 'r.jobs'' hour 1 rolled up') FROM t0;
SET ROLE skiplock_t_watcher;
SELECT is((SELECT count(*)::integer FROM queue.hourly WHERE stage = 'r.jobs'), 0,
          'a monitor not granted r.jobs sees none of its hours, rolled up or not');
SELECT is((SELECT count(*)::integer FROM queue.hourly WHERE stage = 's.one'), 2, 'and still sees the open stage''s');
RESET ROLE;
SELECT is((SELECT count(*)::integer FROM queue.hourly WHERE stage = 'r.jobs'), 2, 'the superuser sees both of r.jobs'' hours');

-- live_counts: exact on a small table, sampled above sample_pages, running always exact, hidden stages left out.
SELECT queue.enqueue(jsonb_build_object('pad', repeat('x', 200)), 'lc.jobs') FROM generate_series(1, 300);
SELECT queue.enqueue('{}', 'lc.jobs', run_at => now() + interval '1 hour');
SELECT queue.enqueue('{}', 'r.jobs');
SELECT count(*) FROM queue.take_next('lc.jobs', 2, worker => 'w1');
SELECT results_eq($$SELECT ready, scheduled, running, error, estimated FROM queue.live_counts() WHERE stage = 'lc.jobs'$$,
                  $$VALUES (298::bigint, 1::bigint, 2::bigint, 0::bigint, false)$$, 'a small table: exact counts');
SELECT results_eq($$SELECT running, estimated FROM queue.live_counts(sample_pages => 1) WHERE stage = 'lc.jobs'$$,
                  $$VALUES (2::bigint, true)$$, 'above sample_pages pages: estimated, running still exact');
SET ROLE skiplock_t_watcher;
SELECT is((SELECT string_agg(stage, ',' ORDER BY stage) FROM queue.live_counts()), 'lc.jobs', 'a monitor not granted r.jobs: live_counts leaves it out');
SELECT is((SELECT string_agg(worker || ':' || stage || ':' || running, ',') FROM queue.workers()), 'w1:lc.jobs:2', 'workers(): the running tasks per worker and stage');
RESET ROLE;
SELECT throws_ok('SELECT * FROM queue.live_counts(0)', '22023', 'sample_pages must be 1 or more', 'live_counts refuses sample_pages 0');

SELECT * FROM finish();
ROLLBACK;
