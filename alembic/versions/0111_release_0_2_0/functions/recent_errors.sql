-- recent_errors(for_stage, since, sample_pages): why tasks fail, grouped by stage and error text, for
-- a dashboard on a large queue: the live tasks waiting for a retry (status error) and the runs that
-- failed for good (fatal) in the last `since`. With for_stage, both exact (the stage's waiting rows
-- through the claim index). Without, the live part is estimated from a block sample of about
-- sample_pages pages of queue.live_tasks when it is larger (as live_counts; estimated = true; an
-- error text only a few live tasks share may be missed: the stage's own page counts them), and the
-- fatal part is exact, one index range a stage of history. queue.errors counts everything, at the
-- price of reading every live task and all retained history. Stages the caller was not granted
-- (_hidden_stages) are left out. Reads live_tasks and history; locks and writes nothing. Raises
-- 22023 for since NULL, negative or over 100 years, or sample_pages NULL or below 1.
CREATE OR REPLACE FUNCTION queue.recent_errors(for_stage text DEFAULT NULL, since interval DEFAULT interval '1 hour',
                                               sample_pages integer DEFAULT 500)
    RETURNS TABLE (stage text, error text, tasks bigint, last_seen timestamptz, estimated boolean)
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- The indexes, whatever the statistics say (the claim index for one stage's errors, history's
    -- by stage and finish time), and no parallel workers taking the workers' CPU.
    SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0
AS $$
DECLARE
    v_hidden text[] := queue._hidden_stages();
    v_pct    double precision := queue._sample_percent('recent_errors', recent_errors.sample_pages);
    v_bad    text;  -- the first bad argument's name
BEGIN
    v_bad := CASE WHEN recent_errors.since IS NULL OR recent_errors.since < interval '0'
                       OR recent_errors.since > interval '100 years' THEN 'since' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('recent_errors', v_bad, pg_catalog.jsonb_build_object('since', recent_errors.since::text));
    END IF;
    RETURN QUERY
    SELECT e.stage, e.error_text, pg_catalog.round(pg_catalog.sum(e.tasks))::bigint, pg_catalog.max(e.seen),
           pg_catalog.bool_or(e.estimated)
      FROM (SELECT t.stage, t.error_text, pg_catalog.count(*) * 100 / v_pct AS tasks, pg_catalog.max(t.updated) AS seen,
                   v_pct < 100 AS estimated
              FROM queue.live_tasks t TABLESAMPLE SYSTEM (v_pct)
             WHERE recent_errors.for_stage IS NULL AND t.status = 'error' AND t.stage <> ALL (v_hidden)
             GROUP BY t.stage, t.error_text
            UNION ALL
            SELECT t.stage, t.error_text, pg_catalog.count(*), pg_catalog.max(t.updated), false
              FROM queue.live_tasks t
             WHERE t.stage = recent_errors.for_stage AND t.status = 'error' AND t.stage <> ALL (v_hidden)
             GROUP BY t.stage, t.error_text
            UNION ALL
            SELECT h.stage, h.error_text, pg_catalog.count(*), pg_catalog.max(h.finished), false
              FROM queue.history h
             WHERE h.stage = ANY (CASE WHEN recent_errors.for_stage IS NULL
                                       THEN ARRAY(SELECT s.stage FROM queue._history_stages() AS s(stage))
                                       ELSE ARRAY[recent_errors.for_stage] END)  -- the index's leading column
               AND h.finished >= pg_catalog.now() - recent_errors.since
               AND h.finished <= pg_catalog.now()  -- prunes the partitions made ahead
               AND h.status = 'fatal' AND h.stage <> ALL (v_hidden)
             GROUP BY h.stage, h.error_text) e
     GROUP BY e.stage, e.error_text;
END
$$;
COMMENT ON FUNCTION queue.recent_errors(text, interval, integer) IS 'Failures by stage and error text: live tasks waiting for a retry (sampled on a large table without a stage: estimated) and fatal runs of the last since (exact). Bounded, unlike queue.errors.';
REVOKE ALL ON FUNCTION queue.recent_errors(text, interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.recent_errors(text, interval, integer) TO skiplock_monitor, skiplock_admin;
