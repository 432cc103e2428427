-- The suite's own CHECK: every database the tests use has queue.live_tasks checked by
-- queue._live_row_ok (dev.testdb.LIVE_ROW_CHECK; the shipped table has no CHECK), so that a
-- function that wrote an inconsistent row would fail its tests. Here: it is on, and it bites.
BEGIN;
SELECT plan(9);

SELECT is((SELECT pg_catalog.pg_get_constraintdef(c.oid) FROM pg_catalog.pg_constraint c
            WHERE c.conrelid = 'queue.live_tasks'::regclass AND c.conname = 'live_tasks_valid'),
          'CHECK (queue._live_row_ok(status, attempt, lease, lease_expires, started, rerun, repeat, slot, group_key, waits))',
          'the test database checks every live row with queue._live_row_ok');

CREATE TEMP TABLE t (id bigint);
INSERT INTO t SELECT queue.enqueue('{}'::jsonb, 'live-row-check');

SELECT throws_ok($$UPDATE queue.live_tasks SET status = 'running' WHERE id = (SELECT id FROM t)$$,
                 '23514', NULL, 'a running task without a lease is refused');
SELECT throws_ok($$UPDATE queue.live_tasks SET attempt = -1 WHERE id = (SELECT id FROM t)$$,
                 '23514', NULL, 'a negative attempt is refused');
SELECT throws_ok($$UPDATE queue.live_tasks SET rerun = true WHERE id = (SELECT id FROM t)$$,
                 '23514', NULL, 'a rerun mark on a task that is not running is refused');
SELECT throws_ok($$UPDATE queue.live_tasks SET repeat = interval '1 hour' WHERE id = (SELECT id FROM t)$$,
                 '23514', NULL, 'a repeat without a slot is refused');
SELECT throws_ok($$UPDATE queue.live_tasks SET group_key = '' WHERE id = (SELECT id FROM t)$$,
                 '23514', NULL, 'an empty group_key is refused');
SELECT throws_ok($$UPDATE queue.live_tasks SET status = 'waiting' WHERE id = (SELECT id FROM t)$$,
                 '23514', NULL, 'a waiting task with nothing to wait for (waits 0) is refused');
SELECT throws_ok($$UPDATE queue.live_tasks SET waits = 1 WHERE id = (SELECT id FROM t)$$,
                 '23514', NULL, 'a ready task that counts tasks to wait for is refused');
SELECT throws_ok($$UPDATE queue.live_tasks SET status = 'waiting', waits = 1, attempt = 1 WHERE id = (SELECT id FROM t)$$,
                 '23514', NULL, 'a waiting task that has run is refused');

SELECT * FROM finish();
ROLLBACK;
