-- Per stage and UTC hour over the last 7 days: what queue.finished_hours holds (rolled up by
-- maintain() up to queue.finished_hours_clock, 5 to 6 minutes ago), plus the runs finished since,
-- counted from history one index range a stage (history's stages by a loose index scan,
-- _history_stages). Its cost is that of the last minutes' runs (more while maintain() is not
-- running), not of the days shown. Runs counted without a history row (queue.finished_counts:
-- stages that keep no history of them) add to the counts, not to run times.
CREATE OR REPLACE VIEW queue.hourly AS
WITH since AS (  -- where history is read from: not rolled up, and within the 7 days
    SELECT GREATEST(c.rolled_to, pg_catalog.date_trunc('hour', pg_catalog.now(), 'UTC') - interval '7 days') AS at
      FROM queue.finished_hours_clock c
)
SELECT r.stage, r.hour,
       pg_catalog.sum(r.runs)::bigint AS finished,
       coalesce(pg_catalog.sum(r.runs) FILTER (WHERE r.status = 'done'), 0)::bigint AS done,
       coalesce(pg_catalog.sum(r.runs) FILTER (WHERE r.status = 'fatal'), 0)::bigint AS fatal,
       coalesce(pg_catalog.sum(r.runs) FILTER (WHERE r.status = 'cancelled'), 0)::bigint AS cancelled,
       CASE WHEN pg_catalog.sum(r.timed) > 0 THEN pg_catalog.sum(r.run_time) END AS total_run_time,
       pg_catalog.sum(r.run_time) / NULLIF(pg_catalog.sum(r.timed), 0)::double precision AS avg_run_time
  FROM (SELECT f.stage, f.hour, f.status, f.runs, f.timed, f.run_time
          FROM queue.finished_hours f
         WHERE f.hour >= pg_catalog.date_trunc('hour', pg_catalog.now(), 'UTC') - interval '7 days'
           AND f.stage <> ALL ((SELECT queue._hidden_stages())::text[])  -- restricted stages the caller was not granted
        UNION ALL
        SELECT h.stage, pg_catalog.date_trunc('hour', h.finished, 'UTC'), h.status, pg_catalog.count(*),
               pg_catalog.count(h.started), coalesce(pg_catalog.sum(h.finished - h.started), interval '0')
          FROM queue.history h
         WHERE h.stage = ANY (ARRAY(SELECT s.stage FROM queue._history_stages() AS s(stage)))  -- the index's leading column
           -- A bound on the partition key itself lets the executor skip every older partition. The
           -- upper bound excludes nothing: with it the planner estimates the two as a narrow range;
           -- the lower one alone, known only at run time, is estimated to keep a third of history
           -- (at 50 million rows in a day's partition the whole partition was read; docs/decisions.md).
           AND h.finished >= (SELECT s.at FROM since s) AND h.finished < 'infinity'
         GROUP BY 1, 2, 3
        -- restricted stages the caller was not granted, after counting (see queue.stats)
        HAVING CASE WHEN pg_catalog.count(*) > 0 THEN h.stage <> ALL ((SELECT queue._hidden_stages())::text[]) END
        UNION ALL
        SELECT c.stage, pg_catalog.date_trunc('hour', c.minute, 'UTC'), c.status, pg_catalog.sum(c.runs), 0::bigint,
               interval '0'
          FROM queue.finished_counts c
         WHERE c.minute >= pg_catalog.date_trunc('hour', pg_catalog.now(), 'UTC') - interval '7 days'
           AND c.stage <> ALL ((SELECT queue._hidden_stages())::text[])
         GROUP BY 1, 2, 3) r
 GROUP BY r.stage, r.hour;
COMMENT ON VIEW queue.hourly IS 'Per stage and UTC hour of finishing, over the last 7 days: runs finished (done, fatal, cancelled) and their total and average run time. From queue.finished_hours, and history for the last minutes.';
COMMENT ON COLUMN queue.hourly.stage IS 'Stage.';
COMMENT ON COLUMN queue.hourly.hour IS 'Start of the UTC hour the runs finished in.';
COMMENT ON COLUMN queue.hourly.finished IS 'Runs finished in the hour (history rows and runs counted without one).';
COMMENT ON COLUMN queue.hourly.done IS 'Of them, done.';
COMMENT ON COLUMN queue.hourly.fatal IS 'Of them, failed for good.';
COMMENT ON COLUMN queue.hourly.cancelled IS 'Of them, cancelled.';
COMMENT ON COLUMN queue.hourly.total_run_time IS 'Sum of finished - started of the last attempts (history rows only).';
COMMENT ON COLUMN queue.hourly.avg_run_time IS 'Average of finished - started of the last attempts (history rows only).';
REVOKE ALL ON queue.hourly FROM PUBLIC;
GRANT SELECT ON queue.hourly TO skiplock_monitor, skiplock_admin;
