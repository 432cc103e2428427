CREATE OR REPLACE VIEW queue.errors AS
SELECT e.stage, e.error_text AS error, pg_catalog.count(*) AS tasks, pg_catalog.max(e.seen) AS last_seen
  FROM (SELECT t.stage, t.error_text, t.updated AS seen
          FROM queue.live_tasks t
         WHERE t.status = 'error'
           AND t.stage <> ALL ((SELECT queue._hidden_stages())::text[])  -- restricted stages the caller was not granted
        UNION ALL
        SELECT h.stage, h.error_text, h.finished
          FROM queue.history h
         WHERE h.status = 'fatal'
           AND h.stage <> ALL ((SELECT queue._hidden_stages())::text[])) e
 GROUP BY e.stage, e.error_text;
COMMENT ON VIEW queue.errors IS 'Why tasks fail: live tasks waiting for a retry and fatal tasks in retained history, grouped by stage and error text.';
COMMENT ON COLUMN queue.errors.stage IS 'Stage.';
COMMENT ON COLUMN queue.errors.error IS 'Error text (as kept: at most 2,000 characters).';
COMMENT ON COLUMN queue.errors.tasks IS 'Tasks whose last error is this one.';
COMMENT ON COLUMN queue.errors.last_seen IS 'When a task last failed with it.';
REVOKE ALL ON queue.errors FROM PUBLIC;
GRANT SELECT ON queue.errors TO skiplock_monitor, skiplock_admin;
