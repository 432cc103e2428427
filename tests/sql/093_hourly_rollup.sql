-- The hourly rollup (queue.finished_hours, filled by maintain() through _roll_up_hours) and what
-- reads it: queue.hourly counts the same runs as history across an hour boundary, closed hours from
-- the rollup and the later ones from history; a finish that commits within the margin after its
-- hour is counted; a second call adds nothing; rows older than 8 days go; restricted stages stay
-- hidden from a monitor. Also queue.live_counts (exact, sampled, hidden stages) and queue.workers.
BEGIN;
SELECT plan(37);

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

-- The rollup as maintain() keeps it: the clock at the start of hour 1, as if rolled up to there.
UPDATE queue.finished_hours_clock SET rolled_to = (SELECT t FROM t0);
SELECT is(queue._roll_up_hours(t + interval '1 hour' + interval '4 minutes 59 seconds'), 59,
          '4 min 59 s after hour 1 ended: its first 59 minutes are rolled up, not its last (within the margin)') FROM t0;
SELECT is((SELECT rolled_to FROM queue.finished_hours_clock), t + interval '59 minutes', 'the clock stops there') FROM t0;
SELECT results_eq($$SELECT f.status::text, f.runs FROM queue.finished_hours f, t0 WHERE f.stage = 's.one' AND f.hour = t0.t ORDER BY 1$$,
                  $$VALUES ('done', 2::bigint), ('fatal', 1::bigint)$$, 'hour 1 so far: two done, one fatal');
SELECT set_eq('SELECT * FROM pg_temp.from_view()', 'SELECT * FROM pg_temp.from_history()',
              'part of hour 1 from the rollup, the rest from history: the same counts as history');

-- A finish of hour 1's last minute that commits within the margin (its row carries a time from inside its transaction).
SELECT pg_temp.run('s.one', 'done', t + interval '59 minutes 30 seconds', interval '5 seconds') FROM t0;
SELECT is(queue._roll_up_hours(t + interval '1 hour' + interval '5 minutes'), 1,
          '5 minutes after hour 1 ended, its last minute is rolled up') FROM t0;
SELECT results_eq($$SELECT f.status::text, f.runs, f.timed, f.run_time FROM queue.finished_hours f, t0
                     WHERE f.stage = 's.one' AND f.hour = t0.t ORDER BY 1$$,
                  $$VALUES ('done', 4::bigint, 4::bigint, interval '17 seconds'), ('fatal', 1, 1, interval '1 second')$$,
                  'hour 1 in the rollup: its last instant and the late commit within the margin counted');
SELECT set_eq('SELECT * FROM pg_temp.from_view()', 'SELECT * FROM pg_temp.from_history()',
              'hour 1 from the rollup, hour 2 from history: the same counts as history');

-- Again at the same time: nothing due, nothing written (each minute is added once).
CREATE TEMP TABLE before AS SELECT * FROM queue.finished_hours;
SELECT is(queue._roll_up_hours(t + interval '1 hour' + interval '5 minutes 59 seconds'), 0, 'a second call within the minute does nothing') FROM t0;
SELECT set_eq('SELECT * FROM queue.finished_hours', 'SELECT * FROM before', 'and the rollup is unchanged (no double count)');

-- A finish that commits after its minute was rolled up is not counted (the margin is the bound).
SELECT pg_temp.run('s.one', 'done', t + interval '20 minutes', interval '1 second') FROM t0;
SELECT is((SELECT v.done FROM queue.hourly v, t0 WHERE v.stage = 's.one' AND v.hour = t0.t), 4::bigint,
          'a run of hour 1 committed after its minute was rolled up is left out of queue.hourly (history still has it)');
DELETE FROM queue.history WHERE finished = (SELECT t + interval '20 minutes' FROM t0);

-- maintain() runs the step before rotating.
SELECT results_eq($$SELECT m.count, m.detail FROM t0, queue.maintain(t0.t + interval '2 hours' + interval '5 minutes') m
                     WHERE m.task = 'roll_up_hours'$$,
                  $$VALUES (60, '60 min of finished runs rolled up into finished_hours')$$, 'maintain() rolls up hour 2 once it is due');
SELECT is((SELECT string_agg(task, ',' ORDER BY n) FROM t0, queue.maintain(t0.t + interval '2 hours' + interval '11 minutes') WITH ORDINALITY AS m(task, count, detail, n)),
          'reap_hung,fire_schedules,roll_up_hours,rotate_partitions,stage_waiters,finished_counts,compact', 'the step comes before rotation');
SELECT set_eq('SELECT * FROM pg_temp.from_view()', 'SELECT * FROM pg_temp.from_history()',
              'both hours from the rollup: still the same counts as history');
SELECT is((SELECT count(*)::integer FROM queue.finished_hours f, t0 WHERE f.hour = t0.t + interval '1 hour'), 2,
          'hour 2 in the rollup: done and cancelled');

-- Bounded: at most a day a call, and the rows of hours over 8 days old go as the hour turns.
SELECT is(queue._roll_up_hours(t + interval '8 days' + interval '1 hour' + interval '10 minutes'), 1440, 'eight days later: a day at most a call') FROM t0;
SELECT is((SELECT sum(queue._roll_up_hours(t + interval '8 days' + interval '1 hour' + interval '10 minutes'))::integer FROM t0, generate_series(1, 8)),
          8 * 1440 - 61 - 1440, 'the next calls catch up to 5 minutes ago (8 days less the 61 minutes rolled up before)');
SELECT is((SELECT count(*)::integer FROM queue.finished_hours f, t0 WHERE f.hour = t0.t), 0, 'hour 1, now over 8 days old, is deleted');
SELECT is((SELECT count(*)::integer FROM queue.finished_hours f, t0 WHERE f.hour = t0.t + interval '1 hour'), 2, 'hour 2 (8 days old) is kept');

-- A first call (no clock yet) starts 8 days back.
UPDATE queue.finished_hours_clock SET rolled_to = NULL;
SELECT is(queue._roll_up_hours(t + interval '1 hour' + interval '5 minutes'), 1440, 'the first call rolls up a day…') FROM t0;
SELECT is((SELECT rolled_to FROM queue.finished_hours_clock), t + interval '1 hour' - interval '7 days',
          '…from 8 days before the hour it stops in') FROM t0;

-- Restricted stages: hidden from a monitor not granted, in the rollup's rows too.
DELETE FROM queue.finished_hours;
UPDATE queue.finished_hours_clock SET rolled_to = NULL;
SELECT pg_temp.run('r.jobs', 'done', t + interval '5 minutes', interval '1 second') FROM t0;
SELECT pg_temp.run('r.jobs', 'done', t + interval '65 minutes', interval '1 second') FROM t0;
SELECT queue.grant_stage('r.jobs', 'skiplock_admin');
CREATE ROLE skiplock_t_watcher LOGIN IN ROLE skiplock_monitor;
UPDATE queue.finished_hours_clock SET rolled_to = (SELECT t FROM t0);
SELECT is(queue._roll_up_hours(t + interval '1 hour' + interval '5 minutes'), 60, 'r.jobs'' hour 1 rolled up') FROM t0;
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
SELECT is((SELECT string_agg(stage, ',' ORDER BY stage) FROM queue.live_counts()), 'lc.jobs,s.one',
          'a monitor not granted r.jobs: live_counts leaves it out (and lists s.one, with runs rolled up in the last day)');
SELECT is((SELECT string_agg(worker || ':' || stage || ':' || running, ',') FROM queue.workers()), 'w1:lc.jobs:2', 'workers(): the running tasks per worker and stage');
RESET ROLE;
SELECT throws_ok('SELECT * FROM queue.live_counts(0)', '22023', 'sample_pages must be 1 or more', 'live_counts refuses sample_pages 0');

-- recent_errors: live tasks waiting for a retry (exact for one stage) and fatal runs of the window.
SELECT count(queue.fail(t.id, t.lease, 'boom')) FROM queue.take_next('lc.jobs', 1) t;
SELECT pg_temp.run('r.jobs', 'fatal', now() - interval '1 minute', interval '1 second');
SELECT results_eq($$SELECT stage, error, tasks, estimated FROM queue.recent_errors('lc.jobs')$$,
                  $$VALUES ('lc.jobs', 'boom', 1::bigint, false)$$, 'recent_errors of a stage: its live error tasks, exact');
SELECT is((SELECT tasks FROM queue.recent_errors(since => interval '4 hours') WHERE stage = 's.one'), 1::bigint,
          'a fatal run within since is counted…');
SELECT is((SELECT count(*)::integer FROM queue.recent_errors() WHERE stage = 's.one'), 0, '…and one before it (the default hour) is not');
SET ROLE skiplock_t_watcher;
SELECT is((SELECT string_agg(stage, ',' ORDER BY stage) FROM queue.recent_errors(since => interval '4 hours')), 'lc.jobs,s.one',
          'a monitor not granted r.jobs: recent_errors leaves its fatal run out');
RESET ROLE;
SELECT is((SELECT count(*)::integer FROM queue.recent_errors() WHERE stage = 'r.jobs'), 1, 'the superuser sees it');
SELECT throws_ok($$SELECT * FROM queue.recent_errors(since => interval '-1 hour')$$, '22023',
                 'since must be an interval from 0 to 100 years', 'recent_errors refuses a negative since');

SELECT * FROM finish();
ROLLBACK;
