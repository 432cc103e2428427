-- The monitoring views that count every live task or history row take the restricted stages out
-- after counting (HAVING), and queue.tasks tests them in a form estimated to keep the rows: a
-- filter `stage <> ALL (the list _hidden_stages() returns at run time)` is estimated to keep no
-- row when few stages hold the tasks, and the counts then sorted every row (on disk at a million:
-- 12.3 s for queue.stats at 10 million live tasks, 3.7 s counted first), and a page of
-- queue.tasks sorted them all instead of reading the id indexes backwards (docs/performance.md).
-- Here one stage holds 20,000 live tasks and 20,000 history rows: the scans must be estimated at
-- their size. Hiding itself: 141_stage_access_views.sql.
-- queue.hourly reads history only after the roll-up's clock, a bound known at run time: alone it
-- was estimated to keep a third of history, and at 50 million rows the whole day's partition was
-- read (5.5 s). Here a second stage holds 20,000 runs over the last 2.8 hours, the clock 5 minutes
-- back: the read must be estimated narrow, and count exactly the runs from the clock on.
BEGIN;
SELECT plan(10);

INSERT INTO queue.live_tasks (stage, run_at, payload)
SELECT 'vc.one', now() - interval '1 minute', '{}' FROM pg_catalog.generate_series(1, 20000);
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished)
SELECT 5000000 + g, 'vc.one', 'done', 0, now(), '{}', 1, now(), now(), now() - interval '1 second'
  FROM pg_catalog.generate_series(1, 20000) g;
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished)
SELECT 6000000 + g, 'vc.hours', 'done'::queue.task_status, 0, now(), '{}'::jsonb, 1, now(), now(), now() - g * interval '0.5 seconds'
  FROM pg_catalog.generate_series(1, 20000) g
UNION ALL  -- and one run finished at the clock itself
SELECT 6100000, 'vc.hours', 'done', 0, now(), '{}', 1, now(), now(), pg_catalog.date_trunc('minute', now()) - interval '5 minutes';
UPDATE queue.finished_hours_clock SET rolled_to = pg_catalog.date_trunc('minute', now()) - interval '5 minutes';
ANALYZE queue.live_tasks;
ANALYZE queue.history;

CREATE FUNCTION pg_temp.plan(query text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_plan jsonb;
BEGIN
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || query INTO v_plan;
    RETURN v_plan;
END
$$;
-- The rows the planner expects from the scans of `tables` (a partition's name starts with its table's).
CREATE FUNCTION pg_temp.scanned(query text, tables text) RETURNS numeric LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT coalesce(pg_catalog.sum((n ->> 'Plan Rows')::numeric), 0)
              FROM pg_catalog.jsonb_path_query(pg_temp.plan(query), 'strict $.** ? (exists (@."Relation Name"))') n
             WHERE n ->> 'Relation Name' LIKE tables || '%');
END
$$;

SELECT cmp_ok(pg_temp.scanned('SELECT * FROM queue.stats', 'live_tasks'), '>=', 10000::numeric,
              'queue.stats: the scan of live_tasks is expected to return its rows (one stage holds them)');
SELECT cmp_ok(pg_temp.scanned('SELECT * FROM queue.stats', 'history'), '>=', 10000::numeric,
              'queue.stats: the scan of history is expected to return its rows');
SELECT cmp_ok(pg_temp.scanned('SELECT * FROM queue.metrics', 'live_tasks'), '>=', 10000::numeric,
              'queue.metrics: the scan of live_tasks is expected to return its rows');
SELECT cmp_ok(pg_temp.scanned('SELECT * FROM queue.finished_totals', 'history'), '>=', 10000::numeric,
              'queue.finished_totals: the scan of history is expected to return its rows');
SELECT cmp_ok(pg_temp.scanned('SELECT * FROM queue.tasks', 'live_tasks'), '>=', 10000::numeric,
              'queue.tasks: the scan of live_tasks is expected to return its rows');
SELECT ok(NOT pg_catalog.jsonb_path_exists(pg_temp.plan($$SELECT id FROM queue.tasks WHERE stage = 'vc.one' ORDER BY id DESC LIMIT 50$$),
                                           'strict $.** ? (@."Node Type" == "Sort")'),
          'a page of queue.tasks reads the indexes in id order: no sort');
SELECT is((SELECT pg_catalog.array_agg(id) FROM (SELECT id FROM queue.tasks WHERE stage = 'vc.one' ORDER BY id DESC LIMIT 3) p),
          ARRAY[5020000, 5019999, 5019998]::bigint[], 'and it is the newest tasks');
SELECT results_eq($$SELECT status::text, tasks FROM queue.stats WHERE stage = 'vc.one' ORDER BY 1$$,
                  $$VALUES ('done', 20000::bigint), ('ready', 20000::bigint)$$,
                  'and the counts are those of the rows');

-- The most rows the planner expects from any scan of history or of its indexes in the plan of query.
CREATE FUNCTION pg_temp.widest_history_read(query text) RETURNS numeric LANGUAGE sql AS $$
    SELECT coalesce(pg_catalog.max((n ->> 'Plan Rows')::numeric), 0)
      FROM pg_catalog.jsonb_path_query(pg_temp.plan(query), 'strict $.** ? (exists (@."Plan Rows"))') n
     WHERE coalesce(n ->> 'Index Name', n ->> 'Relation Name') LIKE 'history%'
$$;
SELECT cmp_ok(pg_temp.widest_history_read('SELECT * FROM queue.hourly'), '<=', 2000::numeric,
              'queue.hourly: its read of history after the roll-up''s clock is expected narrow, not a third of history');
SELECT is((SELECT pg_catalog.sum(finished) FROM queue.hourly WHERE stage = 'vc.hours'),
          (SELECT pg_catalog.count(*) FROM queue.history
            WHERE stage = 'vc.hours' AND finished >= (SELECT rolled_to FROM queue.finished_hours_clock))::numeric,
          'and it counts the runs from the clock on, the one finished at it included');

SELECT * FROM finish();
ROLLBACK;
