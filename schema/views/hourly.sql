CREATE OR REPLACE VIEW queue.hourly AS
SELECT h.stage, pg_catalog.date_trunc('hour', h.finished) AS hour,
       pg_catalog.count(*) AS finished,
       pg_catalog.count(*) FILTER (WHERE h.status = 'done') AS done,
       pg_catalog.count(*) FILTER (WHERE h.status = 'fatal') AS fatal,
       pg_catalog.count(*) FILTER (WHERE h.status = 'cancelled') AS cancelled,
       pg_catalog.sum(h.finished - h.started) AS total_run_time,
       pg_catalog.avg(h.finished - h.started) AS avg_run_time
  FROM queue.history h
 -- A bound on the partition key itself (not on date_trunc of it) lets the executor skip every
 -- older partition; now() is fixed when the query starts, so this prunes at run time.
 WHERE h.finished >= pg_catalog.date_trunc('hour', pg_catalog.now()) - interval '7 days'
   AND h.stage <> ALL ((SELECT queue._hidden_stages())::text[])  -- restricted stages the caller was not granted
 GROUP BY 1, 2;
COMMENT ON VIEW queue.hourly IS 'Per stage and hour of finishing, over the last 7 days: runs finished (done, fatal, cancelled) and their total and average run time. Reads only those days'' history partitions; for older hours query queue.history by finished.';
COMMENT ON COLUMN queue.hourly.stage IS 'Stage.';
COMMENT ON COLUMN queue.hourly.hour IS 'Hour the runs finished in.';
COMMENT ON COLUMN queue.hourly.finished IS 'Runs finished in the hour.';
COMMENT ON COLUMN queue.hourly.done IS 'Of them, done.';
COMMENT ON COLUMN queue.hourly.fatal IS 'Of them, failed for good.';
COMMENT ON COLUMN queue.hourly.cancelled IS 'Of them, cancelled.';
COMMENT ON COLUMN queue.hourly.total_run_time IS 'Sum of finished - started of the last attempts.';
COMMENT ON COLUMN queue.hourly.avg_run_time IS 'Average of finished - started of the last attempts.';
REVOKE ALL ON queue.hourly FROM PUBLIC;
GRANT SELECT ON queue.hourly TO skiplock_monitor, skiplock_admin;
