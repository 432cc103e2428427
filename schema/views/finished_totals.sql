-- Runs finished since install per stage and final status, for a Prometheus counter
-- (skiplock_tasks_finished_total): what queue.history holds plus what left it
-- (queue.finished_dropped), and the runs counted without a history row (queue.finished_counts),
-- so rotation, retries and maintain's folding never make it go down. Counts all of history:
-- its cost grows with the history kept (read it every scrape interval, not in a loop).
CREATE OR REPLACE VIEW queue.finished_totals AS
SELECT f.stage, f.status::text AS status, pg_catalog.sum(f.runs)::bigint AS total
  FROM (SELECT h.stage, h.status, pg_catalog.count(*) AS runs
          FROM queue.history h
         GROUP BY h.stage, h.status
        -- restricted stages the caller was not granted, after counting (see queue.stats)
        HAVING CASE WHEN pg_catalog.count(*) > 0 THEN h.stage <> ALL ((SELECT queue._hidden_stages())::text[]) END
        UNION ALL
        SELECT d.stage, d.status, d.total
          FROM queue.finished_dropped d
         WHERE d.stage <> ALL ((SELECT queue._hidden_stages())::text[])
        UNION ALL
        SELECT c.stage, c.status, c.runs  -- runs of stages that keep no history of them
          FROM queue.finished_counts c
         WHERE c.stage <> ALL ((SELECT queue._hidden_stages())::text[])) f
 GROUP BY f.stage, f.status;
COMMENT ON VIEW queue.finished_totals IS 'Runs finished since install per stage and final status (done, fatal, cancelled): retained history, runs counted without a row, and what rotation and retry took out of history. Only grows: a Prometheus counter. Reads all of history.';
COMMENT ON COLUMN queue.finished_totals.stage IS 'Stage.';
COMMENT ON COLUMN queue.finished_totals.status IS 'done, fatal or cancelled.';
COMMENT ON COLUMN queue.finished_totals.total IS 'Runs of the stage that reached the status since install (a counter).';
REVOKE ALL ON queue.finished_totals FROM PUBLIC;
GRANT SELECT ON queue.finished_totals TO skiplock_monitor, skiplock_admin;
