-- queue.stage_waiters stays bounded: a worker that found 500 stage names empty (its takes mark
-- each) and 11,000 more marks whose minute passed are deleted by maintain(), at most 10,000 a
-- call, while a fresh mark stays (an enqueue on it still notifies). Locked marks: _forget_waiters
-- skips them (SKIP LOCKED; two sessions, not here).
BEGIN;
SELECT plan(9);

DELETE FROM queue.stage_waiters;
-- A worker polls 500 empty stages: each take finds nothing and marks its stage.
DO $$
BEGIN
    FOR i IN 1..500 LOOP
        PERFORM * FROM queue.take_next('sw.empty.' || i);
    END LOOP;
END
$$;
SELECT is((SELECT count(*)::integer FROM queue.stage_waiters WHERE stage LIKE 'sw.empty.%'), 500,
          'each take that found its stage empty marked it');
-- Their minute passes (now() does not move in a transaction); 11,000 more marks long gone, and
-- 1,000 ended by a wake-up (until -infinity).
UPDATE queue.stage_waiters SET until = now() - interval '1 second' WHERE stage LIKE 'sw.empty.%';
INSERT INTO queue.stage_waiters (stage, until)
SELECT 'sw.old.' || i, now() - interval '1 day' FROM generate_series(1, 10000) i
UNION ALL SELECT 'sw.woken.' || i, '-infinity' FROM generate_series(1, 1000) i;
DO $$ BEGIN PERFORM * FROM queue.take_next('sw.fresh'); END $$;  -- a fresh mark, made now

SELECT results_eq($$SELECT count, detail FROM queue.maintain() WHERE task = 'stage_waiters'$$,
                  $$VALUES (10000, '10000 stale waiting marks deleted')$$,
                  'maintain deletes stale marks, 10,000 a call');
SELECT results_eq($$SELECT count FROM queue.maintain() WHERE task = 'stage_waiters'$$, $$VALUES (1500)$$,
                  'the next call deletes the rest');
SELECT results_eq($$SELECT count, detail FROM queue.maintain() WHERE task = 'stage_waiters'$$,
                  $$VALUES (0, 'no stale waiting mark')$$,
                  'then there is nothing to delete');
SELECT results_eq($$SELECT stage FROM queue.stage_waiters$$, $$VALUES ('sw.fresh')$$,
                  'only the fresh mark is left');
SELECT ok((SELECT until > now() FROM queue.stage_waiters WHERE stage = 'sw.fresh'), 'and it is still in force');

-- The worker still waiting on a forgotten stage marks it again at its next empty poll.
DO $$ BEGIN PERFORM * FROM queue.take_next('sw.empty.1'); END $$;
SELECT is((SELECT count(*)::integer FROM queue.stage_waiters WHERE stage = 'sw.empty.1'), 1,
          'a take that finds a forgotten stage empty marks it again');

-- Internal: not callable by the application roles.
SELECT ok(NOT has_function_privilege('skiplock_admin', 'queue._forget_waiters()', 'EXECUTE'),
          '_forget_waiters is not granted to skiplock_admin (maintain calls it)');
SELECT ok(NOT has_function_privilege('skiplock_worker', 'queue._forget_waiters()', 'EXECUTE'),
          'nor to skiplock_worker');

SELECT * FROM finish();
ROLLBACK;
