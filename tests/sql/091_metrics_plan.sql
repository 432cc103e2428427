-- queue.metrics with many history partitions (hourly partitions, a month retained, are 745): a
-- scrape must stay below jit_above_cost (else every read JIT-compiles thousands of functions, 6 s
-- at 745 partitions) and read history's last minute only in the partitions that cover it.
BEGIN;
SELECT plan(3);

-- 120 daily partitions, far from now, as rotation leaves them behind; a few finished runs now.
DO $$
DECLARE
    v_day date;
BEGIN
    FOR v_day IN SELECT d::date FROM pg_catalog.generate_series(date '2001-01-01', date '2001-04-30', interval '1 day') d LOOP
        EXECUTE pg_catalog.format('CREATE TABLE queue.%I PARTITION OF queue.history FOR VALUES FROM (%L) TO (%L)',
                                  'history_t' || pg_catalog.to_char(v_day, 'YYYYMMDD'),
                                  v_day::timestamptz, (v_day + 1)::timestamptz);
    END LOOP;
END
$$;
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished)
SELECT g, 'mp.' || (g % 5), 'done', 0, now(), '{}', 1, now(), now(), now() - interval '1 second'
  FROM pg_catalog.generate_series(1, 50) g;

CREATE FUNCTION pg_temp.plan_json(query text) RETURNS json LANGUAGE plpgsql AS $$
DECLARE
    v_plan json;
BEGIN
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || query INTO v_plan;
    RETURN v_plan;
END
$$;

SELECT cmp_ok((pg_temp.plan_json('SELECT * FROM queue.metrics') -> 0 -> 'Plan' ->> 'Total Cost')::float8, '<', 100000::float8,
              'with 120 more history partitions, a scrape of queue.metrics is planned below the default jit_above_cost (100000)');
SELECT ok((SELECT pg_catalog.max(m[1]::integer) FROM pg_catalog.regexp_matches(public.plan_text('SELECT * FROM queue.metrics'),
                                                                             'Subplans Removed: (\d+)', 'g') m) >= 120,
          'the scan of history''s last minute is pruned, when it starts, to the partitions that cover it');
SELECT results_eq($$SELECT stage, finished_last_minute FROM queue.metrics WHERE stage LIKE 'mp.%' AND status = 'done' ORDER BY stage$$,
                  $$VALUES ('mp.0', 10::bigint), ('mp.1', 10), ('mp.2', 10), ('mp.3', 10), ('mp.4', 10)$$,
                  'finished_last_minute counts each stage''s runs of the last minute');

SELECT * FROM finish();
ROLLBACK;
