-- The monitoring views that count every live task or history row take the restricted stages out
-- after counting (HAVING), not from the rows: a row filter on the list _hidden_stages() returns
-- at run time is estimated to keep no row when few stages hold the tasks, and the count then
-- sorted every row (on disk at a million: 12.5 s for queue.stats at 10 million live tasks, 3.9 s
-- counted first; docs/performance.md). Here one stage holds 20,000 live tasks and 20,000 history
-- rows: the scans must be estimated at their size. Hiding itself: 141_stage_access_views.sql.
BEGIN;
SELECT plan(5);

INSERT INTO queue.live_tasks (stage, run_at, payload)
SELECT 'vc.one', now() - interval '1 minute', '{}' FROM pg_catalog.generate_series(1, 20000);
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished)
SELECT 5000000 + g, 'vc.one', 'done', 0, now(), '{}', 1, now(), now(), now() - interval '1 second'
  FROM pg_catalog.generate_series(1, 20000) g;
ANALYZE queue.live_tasks;
ANALYZE queue.history;

-- The rows the planner expects from the scans of `tables` (a partition's name starts with its table's).
CREATE FUNCTION pg_temp.scanned(query text, tables text) RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
    v_plan jsonb;
BEGIN
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || query INTO v_plan;
    RETURN (SELECT coalesce(pg_catalog.sum((n ->> 'Plan Rows')::numeric), 0)
              FROM pg_catalog.jsonb_path_query(v_plan, 'strict $.** ? (exists (@."Relation Name"))') n
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
SELECT results_eq($$SELECT status::text, tasks FROM queue.stats WHERE stage = 'vc.one' ORDER BY 1$$,
                  $$VALUES ('done', 20000::bigint), ('ready', 20000::bigint)$$,
                  'and the counts are those of the rows');

SELECT * FROM finish();
ROLLBACK;
