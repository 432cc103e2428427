-- A view shaped for Prometheus (postgres_exporter's custom queries, see contrib/postgres_exporter):
-- one row for every stage and every status, so that each series exists even when it is 0.
-- Reads live_tasks once; finds history's stages by a loose index scan (_history_stages) and
-- counts its last minute in one range scan for all stages (not a LATERAL per stage: see
-- docs/decisions.md), in the partitions pruned to that minute at run time; adds the runs counted
-- without a history row in the last whole minute (queue.finished_counts).
CREATE OR REPLACE VIEW queue.metrics AS
WITH live AS (
    SELECT t.stage, t.status::text::queue.task_status AS status, pg_catalog.count(*) AS tasks,
           CASE WHEN t.status = 'running'
                THEN pg_catalog.max(pg_catalog.now() - t.started)
                ELSE pg_catalog.max(pg_catalog.now() - t.run_at) FILTER (WHERE t.run_at <= pg_catalog.now())
           END AS oldest_age
      FROM queue.live_tasks t
     GROUP BY t.stage, t.status
    -- restricted stages the caller was not granted, after counting (see queue.stats)
    HAVING CASE WHEN pg_catalog.count(*) > 0 THEN t.stage <> ALL ((SELECT queue._hidden_stages())::text[]) END
), stages AS (
    SELECT l.stage FROM live l
    UNION
    SELECT s.stage FROM queue._history_stages() AS s(stage) WHERE s.stage <> ALL ((SELECT queue._hidden_stages())::text[])
    UNION
    SELECT c.stage FROM queue.finished_counts c WHERE c.stage <> ALL ((SELECT queue._hidden_stages())::text[])
), recent AS (
    SELECT r.stage, r.status, pg_catalog.sum(r.finished)::bigint AS finished
      FROM (SELECT h.stage, h.status, pg_catalog.count(*) AS finished
              FROM queue.history h
             WHERE h.stage = ANY (ARRAY(SELECT st.stage FROM stages st))  -- the index's leading column
               AND h.finished > pg_catalog.now() - interval '1 minute'
               AND h.finished <= pg_catalog.now()  -- prunes the partitions made ahead of time
             GROUP BY h.stage, h.status
            UNION ALL
            -- Runs counted without a history row (queue.finished_counts): the last whole minute.
            SELECT c.stage, c.status, c.runs
              FROM queue.finished_counts c
             -- (queue._count_minute's minute, written out: the view's readers may not call helpers)
             WHERE c.minute = pg_catalog.date_bin(interval '1 minute', pg_catalog.now(), timestamptz '2000-01-01 00:00+00')
                              - interval '1 minute') r
     GROUP BY r.stage, r.status
)
SELECT st.stage,
       ss.status::text AS status,
       coalesce(l.tasks, 0) AS tasks,
       coalesce(pg_catalog.date_part('epoch', l.oldest_age), 0)::double precision AS oldest_age_seconds,
       coalesce(r.finished, 0) AS finished_last_minute
  FROM stages st
 CROSS JOIN pg_catalog.unnest(pg_catalog.enum_range(NULL::queue.task_status)) AS ss(status)
  LEFT JOIN live l ON l.stage = st.stage AND l.status = ss.status
  LEFT JOIN recent r ON r.stage = st.stage AND r.status = ss.status;
COMMENT ON VIEW queue.metrics IS 'For Prometheus (postgres_exporter): one row per stage and status (every status, 0 when none) with live task counts, the age of the oldest waiting or running task, and tasks finished in the last minute. Reads history only for its last minute.';
COMMENT ON COLUMN queue.metrics.stage IS 'Stage (a label): every stage with live tasks or retained history.';
COMMENT ON COLUMN queue.metrics.status IS 'Status (a label): ready, running, error, done, fatal or cancelled.';
COMMENT ON COLUMN queue.metrics.tasks IS 'Gauge: live tasks in this status now (ready, running, error); 0 for done, fatal and cancelled, which finished_last_minute counts (counting all retained history would read every partition; queue.stats does).';
COMMENT ON COLUMN queue.metrics.oldest_age_seconds IS 'Gauge, seconds: ready and error, how long the longest-waiting due task is past its run_at (the queue''s lag); running, how long the oldest running attempt has run; 0 when none, and for final statuses.';
COMMENT ON COLUMN queue.metrics.finished_last_minute IS 'Gauge: runs of the stage that reached this final status (done, fatal, cancelled) in the last minute; divide by 60 for a rate per second. 0 for live statuses.';
REVOKE ALL ON queue.metrics FROM PUBLIC;
GRANT SELECT ON queue.metrics TO skiplock_monitor, skiplock_admin;
