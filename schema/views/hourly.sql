-- Per stage and UTC hour over the last 7 days: the closed hours from queue.finished_hours (rolled
-- up by maintain()), the hours from queue.finished_hours_clock on counted from history, one index
-- range a stage (history's stages by a loose index scan, _history_stages). Its cost is that of the
-- hours not rolled up yet (the open hour and the margin, or more when maintain() is not running),
-- not of the days shown.
CREATE OR REPLACE VIEW queue.hourly AS
WITH since AS (  -- the first hour history is read for: not rolled up, and within the 7 days
    SELECT GREATEST(c.rolled_to, pg_catalog.date_trunc('hour', pg_catalog.now(), 'UTC') - interval '7 days') AS hour
      FROM queue.finished_hours_clock c
)
SELECT r.stage, r.hour,
       pg_catalog.sum(r.runs)::bigint AS finished,
       coalesce(pg_catalog.sum(r.runs) FILTER (WHERE r.status = 'done'), 0)::bigint AS done,
       coalesce(pg_catalog.sum(r.runs) FILTER (WHERE r.status = 'fatal'), 0)::bigint AS fatal,
       coalesce(pg_catalog.sum(r.runs) FILTER (WHERE r.status = 'cancelled'), 0)::bigint AS cancelled,
       pg_catalog.sum(r.run_time) AS total_run_time,
       pg_catalog.sum(r.run_time) / NULLIF(pg_catalog.sum(r.timed), 0)::double precision AS avg_run_time
  FROM (SELECT f.stage, f.hour, f.status, f.runs, f.timed, f.run_time
          FROM queue.finished_hours f
         WHERE f.hour >= pg_catalog.date_trunc('hour', pg_catalog.now(), 'UTC') - interval '7 days'
           AND f.hour < (SELECT s.hour FROM since s)
           AND f.stage <> ALL ((SELECT queue._hidden_stages())::text[])  -- restricted stages the caller was not granted
        UNION ALL
        SELECT h.stage, pg_catalog.date_trunc('hour', h.finished, 'UTC'), h.status, pg_catalog.count(*),
               pg_catalog.count(h.started), pg_catalog.sum(h.finished - h.started)
          FROM queue.history h
         WHERE h.stage = ANY (ARRAY(SELECT s.stage FROM queue._history_stages() AS s(stage)))  -- the index's leading column
           -- A bound on the partition key itself lets the executor skip every older partition.
           AND h.finished >= (SELECT s.hour FROM since s)
           AND h.stage <> ALL ((SELECT queue._hidden_stages())::text[])
         GROUP BY 1, 2, 3) r
 GROUP BY r.stage, r.hour;
COMMENT ON VIEW queue.hourly IS 'Per stage and UTC hour of finishing, over the last 7 days: runs finished (done, fatal, cancelled) and their total and average run time. Closed hours come from queue.finished_hours, the last ones from history.';
COMMENT ON COLUMN queue.hourly.stage IS 'Stage.';
COMMENT ON COLUMN queue.hourly.hour IS 'Start of the UTC hour the runs finished in.';
COMMENT ON COLUMN queue.hourly.finished IS 'Runs finished in the hour.';
COMMENT ON COLUMN queue.hourly.done IS 'Of them, done.';
COMMENT ON COLUMN queue.hourly.fatal IS 'Of them, failed for good.';
COMMENT ON COLUMN queue.hourly.cancelled IS 'Of them, cancelled.';
COMMENT ON COLUMN queue.hourly.total_run_time IS 'Sum of finished - started of the last attempts.';
COMMENT ON COLUMN queue.hourly.avg_run_time IS 'Average of finished - started of the last attempts.';
REVOKE ALL ON queue.hourly FROM PUBLIC;
GRANT SELECT ON queue.hourly TO skiplock_monitor, skiplock_admin;
