CREATE OR REPLACE VIEW queue.stats AS
SELECT t.stage, t.status::text::queue.task_status AS status, pg_catalog.count(*) AS tasks,
       pg_catalog.count(*) FILTER (WHERE t.status <> 'running' AND t.waits <= 0 AND t.run_at <= pg_catalog.now()) AS due,
       pg_catalog.now() - pg_catalog.min(t.created) AS oldest_age,
       pg_catalog.min(t.run_at) AS next_run_at,
       pg_catalog.count(*) FILTER (WHERE t.status = 'running' AND t.lease_expires < pg_catalog.now()) AS lease_expired
  FROM queue.live_tasks t
 GROUP BY t.stage, t.status
-- Restricted stages the caller was not granted, taken out after counting: as a filter on the
-- rows, the test is estimated to keep none when few stages hold them, and the count then sorted
-- every row (on disk) instead of hashing a few groups. count(*) > 0 holds for every group: the
-- aggregate keeps the test in HAVING, once a group (without one the planner moves it to WHERE).
HAVING CASE WHEN pg_catalog.count(*) > 0 THEN t.stage <> ALL ((SELECT queue._hidden_stages())::text[]) END
UNION ALL
-- Ended runs: history rows, plus the runs counted for stages that keep no history of them
-- (queue.finished_counts, the last 7 days).
SELECT f.stage, f.status, pg_catalog.sum(f.tasks)::bigint, 0, pg_catalog.now() - pg_catalog.min(f.created), NULL, 0
  FROM (SELECT h.stage, h.status, pg_catalog.count(*) AS tasks, pg_catalog.min(h.created) AS created
          FROM queue.history h
         GROUP BY h.stage, h.status
        HAVING CASE WHEN pg_catalog.count(*) > 0 THEN h.stage <> ALL ((SELECT queue._hidden_stages())::text[]) END  -- as above
        UNION ALL
        SELECT c.stage, c.status, pg_catalog.sum(c.runs), NULL
          FROM queue.finished_counts c
         WHERE c.stage <> ALL ((SELECT queue._hidden_stages())::text[])
         GROUP BY c.stage, c.status) f
 GROUP BY f.stage, f.status;
COMMENT ON VIEW queue.stats IS 'Tasks per stage and status: count, how many are due, age of the oldest, next planned run, running tasks whose lease expired. Final statuses count the retained history and the runs counted for stages that keep none (last 7 days).';
COMMENT ON COLUMN queue.stats.stage IS 'Stage.';
COMMENT ON COLUMN queue.stats.status IS 'Status.';
COMMENT ON COLUMN queue.stats.tasks IS 'Number of tasks (finished statuses: rows in retained history, plus runs counted without a row: configure_stage(history => …)).';
COMMENT ON COLUMN queue.stats.due IS 'Ready or failed tasks whose run_at has come: the backlog workers could take now.';
COMMENT ON COLUMN queue.stats.oldest_age IS 'now() minus the creation time of the oldest task in the group (of history rows only, for finished statuses).';
COMMENT ON COLUMN queue.stats.next_run_at IS 'Earliest run_at in the group (live statuses only).';
COMMENT ON COLUMN queue.stats.lease_expired IS 'Running tasks whose lease ran out: reap_hung() will recover them.';
REVOKE ALL ON queue.stats FROM PUBLIC;
GRANT SELECT ON queue.stats TO skiplock_monitor, skiplock_admin;
