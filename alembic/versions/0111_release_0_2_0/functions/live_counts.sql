-- live_counts(sample_pages): the live tasks of each visible stage by status, for a dashboard that
-- refreshes every few seconds: ready (due now), scheduled (ready, due later), running, error
-- (waiting for a retry), waiting (for other tasks), the lag (how long the longest-waiting due task
-- is past its run_at); a stage with no live task but runs in the last day (queue.finished_hours,
-- so not those of the last minutes) gets a row of zeros. Exact while queue.live_tasks has at most
-- sample_pages pages (8 kB each; the default: some 20,000 rows); above, estimated from a block
-- sample of about sample_pages pages (TABLESAMPLE SYSTEM) scaled up, estimated = true, but running
-- still exact up to 5,000 running tasks (the running index): the refresh then costs the same on a
-- million tasks as on twenty thousand. On Citus exact (the coordinator's own table is empty).
-- Stages the caller was not granted (_hidden_stages) are left out. Reads live_tasks and
-- finished_hours; locks and writes nothing. Raises 22023 for sample_pages NULL or below 1.
CREATE OR REPLACE FUNCTION queue.live_counts(sample_pages integer DEFAULT 500)
    RETURNS TABLE (stage text, ready bigint, scheduled bigint, running bigint, error bigint, waiting bigint,
                   lag interval, estimated boolean)
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- The indexes, whatever the statistics say (the running index read when many rows run
    -- beats a pass over all of them), and no parallel workers taking the workers' CPU.
    SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0
AS $$
DECLARE
    v_hidden text[] := queue._hidden_stages();
    v_pct    double precision := queue._sample_percent('live_counts', live_counts.sample_pages);
    v_exact  boolean;  -- running counted exactly: at most 5,000 of them, or no sample
BEGIN
    v_exact := v_pct >= 100 OR (SELECT pg_catalog.count(*) FROM (SELECT FROM queue.live_tasks t WHERE t.status = 'running'
                                                                   LIMIT 5001) r) <= 5000;
    RETURN QUERY
    WITH sampled AS (  -- SYSTEM (100) reads every row: exact
        SELECT t.stage,
               pg_catalog.count(*) FILTER (WHERE t.status = 'ready' AND t.run_at <= pg_catalog.now()) AS ready,
               pg_catalog.count(*) FILTER (WHERE t.status = 'ready' AND t.run_at > pg_catalog.now()) AS scheduled,
               pg_catalog.count(*) FILTER (WHERE t.status = 'running') AS running,
               pg_catalog.count(*) FILTER (WHERE t.status = 'error') AS error,
               pg_catalog.count(*) FILTER (WHERE t.status = 'waiting') AS waiting,
               pg_catalog.max(pg_catalog.now() - t.run_at)
                   FILTER (WHERE t.status IN ('ready', 'error') AND t.run_at <= pg_catalog.now()) AS lag
          FROM queue.live_tasks t TABLESAMPLE SYSTEM (v_pct)
         WHERE t.stage <> ALL (v_hidden)
         GROUP BY t.stage
    ), running AS (  -- exact: the running index
        SELECT t.stage, pg_catalog.count(*) AS running
          FROM queue.live_tasks t
         WHERE t.status = 'running' AND t.stage <> ALL (v_hidden) AND v_exact
         GROUP BY t.stage
    ), rolled AS (  -- stages whose runs finished within the last day, live tasks or not
        SELECT DISTINCT f.stage
          FROM queue.finished_hours f
         WHERE f.hour >= pg_catalog.date_trunc('hour', pg_catalog.now(), 'UTC') - interval '1 day'
           AND f.stage <> ALL (v_hidden)
    )
    SELECT coalesce(s.stage, r.stage, f.stage),
           coalesce(pg_catalog.round(s.ready * 100 / v_pct), 0)::bigint,
           coalesce(pg_catalog.round(s.scheduled * 100 / v_pct), 0)::bigint,
           coalesce(CASE WHEN v_exact THEN r.running ELSE pg_catalog.round(s.running * 100 / v_pct) END, 0)::bigint,
           coalesce(pg_catalog.round(s.error * 100 / v_pct), 0)::bigint,
           coalesce(pg_catalog.round(s.waiting * 100 / v_pct), 0)::bigint,
           s.lag,
           v_pct < 100
      FROM sampled s
      FULL JOIN running r ON r.stage = s.stage
      FULL JOIN rolled f ON f.stage = coalesce(s.stage, r.stage);
END
$$;
COMMENT ON FUNCTION queue.live_counts(integer) IS 'Live tasks per visible stage (and stages with runs in the last day): ready, scheduled, running, error, waiting, lag. Above sample_pages pages estimated from a block sample (estimated = true); running exact up to 5,000.';
REVOKE ALL ON FUNCTION queue.live_counts(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.live_counts(integer) TO skiplock_monitor, skiplock_admin;
