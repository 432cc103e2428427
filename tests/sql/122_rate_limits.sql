-- Rate limits: stage_settings.rate_limit caps the tasks taken per rate_window (windows at multiples
-- of it since the epoch), for the stage or for each group_key (rate_per_group), and rate_burst the
-- tasks per burst part of a window. The count lives in queue.rate_windows; an older window counts
-- as empty, a later one (a clock gone back) leaves nothing. take_locked and consume refuse a
-- rate-limited stage. Windows of 31 days here, so that the test never straddles two. (Concurrent
-- takers over a minute of 1-second windows: tests/py/test_rate_limits.py.)
BEGIN;
SELECT plan(34);

CREATE FUNCTION pg_temp.taken(stage text, batch integer) RETURNS integer LANGUAGE sql AS $$
    SELECT count(*)::integer FROM queue.take_next($1, $2)
$$;
CREATE FUNCTION pg_temp.counted(stage text, grp text DEFAULT '') RETURNS integer LANGUAGE sql AS $$
    SELECT w.taken FROM queue.rate_windows w WHERE w.stage = $1 AND w.group_key = $2
$$;

-- A stage without a limit --------------------------------------------------------------------------------------------
SELECT is((SELECT count(*)::integer FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[4]), 'rt.free')), 4, 'four tasks in a stage without a rate limit');
SELECT is(pg_temp.taken('rt.free', 10), 4, 'a stage without a rate limit takes the whole backlog');
SELECT is_empty($$SELECT 1 FROM queue.rate_windows WHERE stage = 'rt.free'$$, 'and counts nothing in rate_windows');

-- A stage-wide limit ----------------------------------------------------------------------------------------------
SELECT is((queue.configure_stage('rt.stage', rate_limit => 3, rate_window => '31 days')).rate_limit, 3,
          'configure_stage sets rate_limit and rate_window');
SELECT is((SELECT count(*)::integer FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[10]), 'rt.stage')), 10, 'ten tasks in a stage limited to 3 a window');
SELECT is(pg_temp.taken('rt.stage', 2), 2, 'a batch of 2 fits in the window whole');
SELECT is(pg_temp.taken('rt.stage', 5), 1, 'a batch of 5 gets the one left in the window');
SELECT is(pg_temp.taken('rt.stage', 5), 0, 'the window used up, a take gets nothing');
SELECT is(pg_temp.counted('rt.stage'), 3, 'rate_windows counts the 3 taken in the window');
SELECT ok((SELECT bool_and(t.started >= now()) FROM queue.live_tasks t WHERE t.stage = 'rt.stage' AND t.status = 'running'),
          'a rate-limited take starts its tasks at the clock read under the stage''s lock');
UPDATE queue.rate_windows SET window_start = window_start - interval '31 days', burst_start = burst_start - interval '31 days'
 WHERE stage = 'rt.stage';
SELECT is(pg_temp.taken('rt.stage', 5), 3, 'a count of an older window is empty: the new window gives 3 again');
UPDATE queue.rate_windows SET window_start = window_start + interval '62 days', burst_start = burst_start + interval '62 days'
 WHERE stage = 'rt.stage';
SELECT is(pg_temp.taken('rt.stage', 5), 0, 'a count of a later window (a clock gone back) leaves nothing to take');

-- With a group_limit too (the grouped claim counts for the stage) ----------------------------------------------------
SELECT is((queue.configure_stage('rt.both', rate_limit => 3, rate_window => '31 days', group_limit => 5)).group_limit, 5, 'a stage with a rate_limit and a group_limit');
SELECT is((SELECT count(*)::integer FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[6]), 'rt.both', group_key => 'g')), 6, 'six tasks of one group');
SELECT is(pg_temp.taken('rt.both', 10), 3, 'the grouped claim takes no more than the stage''s window has left');
SELECT is(pg_temp.counted('rt.both'), 3, 'and counts them for the stage');

-- Per group ---------------------------------------------------------------------------------------------------------
SELECT ok((queue.configure_stage('rt.group', rate_limit => 2, rate_window => '31 days', rate_per_group => true)).rate_per_group,
          'rate_per_group: the limit applies to each group_key');
SELECT is((SELECT sum(n)::integer FROM (SELECT (SELECT count(*) FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[4]), 'rt.group', group_key => g)) AS n
                                          FROM (VALUES ('a'), ('b'), ('c')) AS v(g)) s), 12, 'four tasks in each of three groups');
SELECT is((SELECT count(*)::integer FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2]), 'rt.group')), 2, 'and two without a group');
SELECT is(pg_temp.taken('rt.group', 100), 8, 'a take gets 2 of each group and the 2 tasks without a group (not limited)');
SELECT is(pg_temp.taken('rt.group', 100), 0, 'then nothing: every group used its window');
SELECT results_eq($$SELECT w.group_key, w.taken FROM queue.rate_windows w WHERE w.stage = 'rt.group' ORDER BY 1$$,
                  $$VALUES ('a', 2), ('b', 2), ('c', 2)$$, 'rate_windows counts each group');

-- Burst ---------------------------------------------------------------------------------------------------------
DO $$ BEGIN PERFORM queue.configure_stage('rt.burst', rate_limit => 10, rate_window => '31 days', rate_burst => 2); END $$;
SELECT is((SELECT count(*)::integer FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[12]), 'rt.burst')), 12, 'twelve tasks, 10 a window in bursts of 2');
SELECT is(pg_temp.taken('rt.burst', 100), 2, 'a take gets no more than the burst');

SELECT results_eq($$SELECT rate_limit, rate_window, rate_burst, rate_per_group FROM queue.stage_config WHERE stage = 'rt.burst'$$,
                  $$VALUES (10, interval '31 days', 2, false)$$, 'queue.stage_config shows a stage''s rate limit');

-- Refusals and removal -------------------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT * FROM queue.take_locked('rt.stage')$$, '0A000', 'stage ''rt.stage'' has concurrency limits',
                 'take_locked refuses a rate-limited stage');
SELECT throws_ok($$SELECT * FROM queue.consume('rt.stage')$$, '0A000', 'stage ''rt.stage'' has concurrency limits',
                 'consume refuses a rate-limited stage');
SELECT is((queue.configure_stage('rt.burst', rate_limit => 0)).rate_burst, NULL::integer, 'rate_limit 0 removes the limit and its burst');
SELECT is(pg_temp.taken('rt.burst', 100), 10, 'and the stage takes its whole backlog');

SELECT throws_ok($$SELECT queue.configure_stage('rt.bad', rate_limit => -1)$$, '22023', 'invalid rate limit',
                 'a negative rate_limit is refused');
SELECT throws_ok($$SELECT queue.configure_stage('rt.bad', rate_limit => 3, rate_burst => 4)$$, '22023', 'invalid stage setting',
                 'a rate_burst above the rate_limit is refused');
SELECT throws_ok($$SELECT queue.configure_stage('rt.bad', rate_limit => 3, rate_window => '1 month')$$, '22023', 'invalid stage setting',
                 'a rate_window in months is refused (a window is a fixed length)');
SELECT throws_ok($$SELECT queue.configure_stage('rt.bad', rate_limit => 3, rate_window => '0')$$, '22023', 'invalid stage setting',
                 'a rate_window under 1 ms is refused');
SELECT throws_ok($$SELECT queue.configure_stage('rt.bad', weight => 0)$$, '22023', 'invalid stage setting',
                 'a weight out of 1..1000 is refused');

SELECT * FROM finish();
ROLLBACK;
