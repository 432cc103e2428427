-- Runs counted without a history row (queue.finished_counts) add to the counts, not to run times.
CREATE OR REPLACE VIEW queue.hourly AS
SELECT f.stage, f.hour,
       pg_catalog.sum(f.runs)::bigint AS finished,
       coalesce(pg_catalog.sum(f.runs) FILTER (WHERE f.status = 'done'), 0)::bigint AS done,
       coalesce(pg_catalog.sum(f.runs) FILTER (WHERE f.status = 'fatal'), 0)::bigint AS fatal,
       coalesce(pg_catalog.sum(f.runs) FILTER (WHERE f.status = 'cancelled'), 0)::bigint AS cancelled,
       pg_catalog.sum(f.run_time) AS total_run_time,
       pg_catalog.sum(f.run_time) / NULLIF(pg_catalog.sum(f.timed), 0)::double precision AS avg_run_time
  FROM (SELECT h.stage, pg_catalog.date_trunc('hour', h.finished) AS hour, h.status, pg_catalog.count(*) AS runs,
               pg_catalog.sum(h.finished - h.started) AS run_time, pg_catalog.count(h.started) AS timed
          FROM queue.history h
         -- A bound on the partition key itself (not on date_trunc of it) lets the executor skip every
         -- older partition; now() is fixed when the query starts, so this prunes at run time.
         WHERE h.finished >= pg_catalog.date_trunc('hour', pg_catalog.now()) - interval '7 days'
           AND h.stage <> ALL ((SELECT queue._hidden_stages())::text[])  -- restricted stages the caller was not granted
         GROUP BY 1, 2, 3
        UNION ALL
        SELECT c.stage, pg_catalog.date_trunc('hour', c.minute), c.status, pg_catalog.sum(c.runs), NULL, 0
          FROM queue.finished_counts c
         WHERE c.minute >= pg_catalog.date_trunc('hour', pg_catalog.now()) - interval '7 days'
           AND c.stage <> ALL ((SELECT queue._hidden_stages())::text[])
         GROUP BY 1, 2, 3) f
 GROUP BY 1, 2;
COMMENT ON VIEW queue.hourly IS 'Per stage and hour of finishing, over the last 7 days: runs finished (done, fatal, cancelled) and their total and average run time. Reads only those days'' history partitions; for older hours query queue.history by finished.';
COMMENT ON COLUMN queue.hourly.stage IS 'Stage.';
COMMENT ON COLUMN queue.hourly.hour IS 'Hour the runs finished in.';
COMMENT ON COLUMN queue.hourly.finished IS 'Runs finished in the hour (history rows and runs counted without one).';
COMMENT ON COLUMN queue.hourly.done IS 'Of them, done.';
COMMENT ON COLUMN queue.hourly.fatal IS 'Of them, failed for good.';
COMMENT ON COLUMN queue.hourly.cancelled IS 'Of them, cancelled.';
COMMENT ON COLUMN queue.hourly.total_run_time IS 'Sum of finished - started of the last attempts (history rows only).';
COMMENT ON COLUMN queue.hourly.avg_run_time IS 'Average of finished - started of the last attempts (history rows only).';
REVOKE ALL ON queue.hourly FROM PUBLIC;
GRANT SELECT ON queue.hourly TO skiplock_monitor, skiplock_admin;
