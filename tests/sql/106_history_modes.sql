-- History modes per stage (configure_stage(history => 'all' | 'failures' | 'none')): what
-- queue.history holds after each end (finish, finish_locked, consume, drain, finish_batch, fail,
-- cancel, reap_hung, a periodic run, a move to next_stage), the runs counted instead in
-- queue.finished_counts and what the views make of them, the default unchanged, the stamp of a
-- task enqueued before a change, the refusals, and maintain's fold of the counts.
BEGIN;
SELECT plan(46);

-- The counts of a stage, by status.
CREATE FUNCTION pg_temp.counted(stage text) RETURNS TABLE (status text, runs integer) LANGUAGE sql AS $$
    SELECT c.status::text, sum(c.runs)::integer FROM queue.finished_counts c WHERE c.stage = counted.stage GROUP BY 1 ORDER BY 1
$$;

-- Settings and refusals.
SELECT is((queue.configure_stage('hm.none', history => 'none', max_attempts => 1)).history, 'none', 'configure_stage sets history ''none''');
SELECT is((queue.configure_stage('hm.fail', history => 'failures', max_attempts => 1)).history, 'failures', 'and ''failures''');
SELECT is((queue.configure_stage('hm.all', history => 'all', max_attempts => 1)).history, NULL, '''all'' is stored as NULL, the default');
SELECT is((queue.configure_stage('hm.none', paused => false)).history, 'none', 'history left out keeps the mode');
SELECT throws_ok($$SELECT queue.configure_stage('hm.bad', history => 'some')$$, '22023', 'invalid history mode',
                 'an unknown history mode: 22023');
SELECT throws_ok($$SELECT queue.configure_stage('*', history => 'none')$$, '22023', 'invalid history mode',
                 'a mode for ''*'': 22023 (enqueue reads the stage''s own row only)');
SELECT lives_ok($$SELECT queue.configure_stage('*', history => 'all')$$, '''all'' for ''*'' is what it has');
SELECT results_eq($$SELECT stage, history FROM queue.stage_config WHERE stage IN ('*', 'hm.none', 'hm.fail', 'hm.all') ORDER BY stage$$,
                  $$VALUES ('*', 'all'), ('hm.all', 'all'), ('hm.fail', 'failures'), ('hm.none', 'none')$$,
                  'stage_config shows each stage''s mode');

-- enqueue and enqueue_batch stamp the stage's mode; a stage without a row keeps all.
SELECT queue.enqueue('{}', 'hm.none') AS n1 \gset
SELECT queue.enqueue('{}', 'hm.plain') AS p1 \gset
SELECT results_eq(format('SELECT history FROM queue.live_tasks WHERE id IN (%s, %s) ORDER BY id', :n1, :p1),
                  $$VALUES ('none'::text), (NULL)$$, 'enqueue stamps the stage''s mode; a stage without a row: NULL (all)');
SELECT queue.enqueue_batch(ARRAY['{}', '{}']::jsonb[], 'hm.fail');
SELECT is((SELECT array_agg(DISTINCT t.history) FROM queue.live_tasks t WHERE t.stage = 'hm.fail'), ARRAY['failures'],
          'and so does enqueue_batch');

-- finish on a 'none' stage: deleted, counted, no history row.
SELECT ok((SELECT queue.finish(t.id, t.lease) FROM queue.take_next('hm.none') t), 'finish of a task of a ''none'' stage: true');
SELECT is_empty(format('SELECT 1 FROM queue.live_tasks WHERE id = %s UNION ALL SELECT 1 FROM queue.history WHERE id = %s', :n1, :n1),
                'it leaves live_tasks and writes no history row');
SELECT results_eq($$SELECT * FROM pg_temp.counted('hm.none')$$, $$VALUES ('done', 1)$$, 'its run is counted as done');

-- finish_locked, consume, drain, finish_batch on 'none'.
SELECT queue.enqueue('{}', 'hm.none') FROM generate_series(1, 8);
SELECT ok((SELECT queue.finish_locked(t.id) FROM queue.take_locked('hm.none') t), 'finish_locked of a ''none'' task: true');
SELECT is((SELECT count(*)::integer FROM queue.consume('hm.none', 2)), 2, 'consume takes two');
SELECT is((SELECT count(*)::integer FROM queue.drain('hm.none', 2)), 2, 'drain takes two');
SELECT is(queue.finish_batch(array_agg(t.id), array_agg(t.lease)), 2, 'finish_batch ends two')
  FROM queue.take_next('hm.none', 2) t;
SELECT results_eq($$SELECT * FROM pg_temp.counted('hm.none')$$, $$VALUES ('done', 8)$$,
                  'finish_locked, consume, drain and finish_batch count what they end: 8 done in all');
SELECT is_empty($$SELECT 1 FROM queue.history WHERE stage = 'hm.none'$$, 'and the ''none'' stage has no history row');

-- fail (fatal), cancel, reap_hung on 'none'.
SELECT ok((SELECT queue.fail(t.id, t.lease, 'boom') FROM queue.take_next('hm.none') t), 'a fatal failure of a ''none'' task');
SELECT queue.enqueue('{}', 'hm.none') AS n2 \gset
SELECT queue.cancel(:n2);
SELECT queue.enqueue('{}', 'hm.none');
SELECT id AS n3 FROM queue.take_next('hm.none') \gset
UPDATE queue.live_tasks SET lease_expires = now() - interval '1 minute' WHERE id = :n3;
SELECT is(queue.reap_hung(), 1, 'reap_hung ends the expired attempt of a ''none'' task (out of attempts: fatal)');
SELECT results_eq($$SELECT * FROM pg_temp.counted('hm.none')$$, $$VALUES ('cancelled', 1), ('done', 8), ('fatal', 2)$$,
                  'fail, cancel and reap_hung count their ends too');
SELECT is_empty($$SELECT 1 FROM queue.history WHERE stage = 'hm.none'$$, 'still no history row');

-- 'failures': fatal ends kept, the others counted.
SELECT ok((SELECT queue.finish(t.id, t.lease) FROM queue.take_next('hm.fail') t), 'finish on a ''failures'' stage');
SELECT ok((SELECT queue.fail(t.id, t.lease, 'boom') FROM queue.take_next('hm.fail') t), 'fail (fatal) on it');
SELECT queue.enqueue('{}', 'hm.fail') AS f3 \gset
SELECT queue.cancel(:f3);
SELECT queue.enqueue('{}', 'hm.fail') AS f4 \gset
SELECT queue.enqueue('{}', 'hm.fail') AS f5 \gset
SELECT id AS f4t FROM queue.take_next('hm.fail') \gset
SELECT id AS f5t FROM queue.take_next('hm.fail') \gset
UPDATE queue.live_tasks SET lease_expires = now() - interval '1 minute' WHERE id = :f5t;
SELECT is(queue.reap_hung(), 1, 'reap_hung ends the expired attempt of a ''failures'' task');
SELECT results_eq($$SELECT status::text, error_text FROM queue.history WHERE stage = 'hm.fail' ORDER BY finished, id$$,
                  $$VALUES ('fatal', 'boom'), ('fatal', 'lease expired at ' || (now() - interval '1 minute')::text || ' (worker unnamed, attempt 1)')$$,
                  'history keeps the fatal ends only (fail, reap_hung)');
SELECT results_eq($$SELECT * FROM pg_temp.counted('hm.fail')$$, $$VALUES ('cancelled', 1), ('done', 1)$$,
                  'the done and cancelled ends are counted');

-- The default: every end in history, nothing counted.
SELECT ok((SELECT queue.finish(t.id, t.lease) FROM queue.take_next('hm.plain') t), 'finish on a stage that keeps all');
SELECT is((SELECT count(*)::integer FROM queue.history WHERE id = :p1 AND status = 'done'), 1, 'its history row is written, as before');
SELECT is_empty($$SELECT 1 FROM queue.finished_counts WHERE stage = 'hm.plain'$$, 'and nothing is counted for it');

-- The views count both.
SELECT results_eq($$SELECT status::text, tasks FROM queue.stats WHERE stage = 'hm.fail' ORDER BY 1$$,
                  $$VALUES ('cancelled', 1::bigint), ('done', 1), ('fatal', 2), ('running', 1)$$,
                  'stats: history rows plus counted runs');
SELECT results_eq($$SELECT finished, done, fatal, cancelled FROM queue.hourly WHERE stage = 'hm.none'$$,
                  $$VALUES (11::bigint, 8::bigint, 2::bigint, 1::bigint)$$, 'hourly: the counted runs in their hour');
SELECT results_eq($$SELECT status, total FROM queue.finished_totals WHERE stage = 'hm.none' ORDER BY 1$$,
                  $$VALUES ('cancelled', 1::bigint), ('done', 8), ('fatal', 2)$$, 'finished_totals: the counted runs');
INSERT INTO queue.finished_counts VALUES ('hm.none', 'done', date_bin(interval '1 minute', now(), timestamptz '2000-01-01 00:00+00') - interval '1 minute', 0, 5);
SELECT is((SELECT finished_last_minute FROM queue.metrics WHERE stage = 'hm.none' AND status = 'done'), 5::bigint,
          'metrics: finished_last_minute counts the last whole minute''s counted runs');

-- A task enqueued before a change takes the new mode (configure_stage re-stamps the waiting tasks).
SELECT queue.enqueue('{}', 'hm.switch') AS s1 \gset
SELECT queue.configure_stage('hm.switch', history => 'none');
SELECT is((SELECT history FROM queue.live_tasks WHERE id = :s1), 'none', 'a waiting task takes the stage''s new mode');
SELECT ok((SELECT queue.finish(t.id, t.lease) FROM queue.take_next('hm.switch') t), 'and ends by it');
SELECT is_empty(format('SELECT 1 FROM queue.history WHERE id = %s', :s1), 'no history row');
SELECT queue.enqueue('{}', 'hm.switch') AS s2 \gset
SELECT queue.configure_stage('hm.switch', history => 'all');
SELECT is((SELECT history FROM queue.live_tasks WHERE id = :s2), NULL, 'back to all: NULL again');

-- A periodic task of a 'none' stage: its runs are counted, the row re-armed.
SELECT queue.enqueue('{}', 'hm.per', repeat => interval '1 hour') AS r1 \gset
SELECT queue.configure_stage('hm.per', history => 'none');
SELECT ok((SELECT queue.finish(t.id, t.lease) FROM queue.take_next('hm.per') t), 'a periodic task''s run on a ''none'' stage');
SELECT results_eq(format('SELECT status::text, (SELECT sum(runs)::integer FROM queue.finished_counts WHERE stage = ''hm.per'') FROM queue.live_tasks WHERE id = %s', :r1),
                  $$VALUES ('ready', 1)$$, 'is counted, and the row re-armed');

-- finish(next_stage): the run is recorded by the mode of its stage, the moved task takes the next stage's.
SELECT queue.enqueue('{}', 'hm.none') AS m1 \gset
SELECT ok((SELECT queue.finish(t.id, t.lease, next_stage => 'hm.plain') FROM queue.take_next('hm.none') t), 'a move from a ''none'' stage');
SELECT results_eq(format('SELECT (SELECT history FROM queue.live_tasks WHERE id = %s), (SELECT count(*)::integer FROM queue.history WHERE id = %s)', :m1, :m1),
                  $$VALUES (NULL::text, 0)$$, 'the run is counted, not kept; the moved task keeps all, as its new stage');

-- maintain folds the counts: a closed hour's rows into one, rows older than 7 days into finished_dropped.
SELECT status, total AS before FROM queue.finished_totals WHERE stage = 'hm.none' AND status = 'done' \gset
INSERT INTO queue.finished_counts VALUES
    ('hm.none', 'done', date_bin(interval '1 hour', now(), timestamptz '2000-01-01 00:00+00') - interval '2 hours' + interval '5 minutes', 11, 3),
    ('hm.none', 'done', date_bin(interval '1 hour', now(), timestamptz '2000-01-01 00:00+00') - interval '2 hours' + interval '7 minutes', 12, 4),
    ('hm.none', 'done', now() - interval '8 days', 13, 6);
SELECT is(queue._fold_counts(), 3, '_fold_counts deletes the rows of closed hours (and older than 7 days) it folds');
SELECT results_eq($$SELECT runs FROM queue.finished_counts WHERE stage = 'hm.none' AND backend = 0
                     AND minute = date_bin(interval '1 hour', now(), timestamptz '2000-01-01 00:00+00') - interval '2 hours'$$,
                  $$VALUES (7::bigint)$$, 'a closed hour: one row (backend 0) with the sum of its backends'' rows');
SELECT is((SELECT total FROM queue.finished_totals WHERE stage = 'hm.none' AND status = 'done'), (:before + 13)::bigint,
          'finished_totals counts every run once, before and after the fold');

SELECT * FROM finish();
ROLLBACK;
