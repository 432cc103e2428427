CREATE OR REPLACE VIEW queue.tasks AS
SELECT u.*
  FROM (
    SELECT t.id, t.stage, t.status::text::queue.task_status AS status, t.priority, t.payload, t.key, t.attempt, t.run_at, t.error_text,
           t.created, t.updated, t.started, NULL::timestamptz AS finished, t.worker, t.lease_expires,
           t.group_key, t.repeat, t.run_as, NULL::jsonb AS result, t.progress,
           CASE WHEN t.waits > 0 THEN ARRAY(SELECT d.after FROM queue.dependencies d WHERE d.task = t.id ORDER BY d.after)
           END AS waits_for
      FROM queue.live_tasks t
    UNION ALL
    SELECT h.id, h.stage, h.status, h.priority, h.payload, h.key, h.attempt, h.run_at, h.error_text,
           h.created, h.finished AS updated, h.started, h.finished, h.worker, NULL::timestamptz AS lease_expires,
           h.group_key, NULL::interval AS repeat, h.run_as, h.result, NULL::jsonb AS progress, NULL::bigint[] AS waits_for
      FROM queue.history h) u
-- Restricted stages the caller was not granted, applied to both arms of the union. Not written
-- `u.stage <> ALL (hidden)`: that is estimated to keep no row when one to five stages hold the
-- tasks, and a page (`WHERE stage = … ORDER BY id DESC LIMIT 50`) then sorted every row instead of
-- reading the two id indexes backwards. This form is estimated to keep almost every row, and
-- for a caller with nothing hidden (an admin, or no restricted stage) it tests one number a row.
 WHERE (SELECT pg_catalog.cardinality(queue._hidden_stages())) = 0
    OR NOT (ARRAY[u.stage] <@ (SELECT queue._hidden_stages())::text[]);
COMMENT ON VIEW queue.tasks IS 'Every task, live (queue.live_tasks) or finished (queue.history): look one up by id. A task that moved through stages has a finished row per stage it completed; a periodic task has a finished row per run and one live row for its next run.';
COMMENT ON COLUMN queue.tasks.id IS 'Task id.';
COMMENT ON COLUMN queue.tasks.stage IS 'Stage of this row.';
COMMENT ON COLUMN queue.tasks.status IS 'ready, running, error (retry scheduled), waiting (for the tasks in waits_for), done, fatal or cancelled.';
COMMENT ON COLUMN queue.tasks.priority IS 'Lower runs first.';
COMMENT ON COLUMN queue.tasks.payload IS 'The work, as enqueued.';
COMMENT ON COLUMN queue.tasks.key IS 'Idempotency key, if any.';
COMMENT ON COLUMN queue.tasks.attempt IS 'Attempts so far.';
COMMENT ON COLUMN queue.tasks.run_at IS 'Planned time of the next (live) or last (finished) attempt.';
COMMENT ON COLUMN queue.tasks.error_text IS 'Error of the last failed attempt.';
COMMENT ON COLUMN queue.tasks.created IS 'When it was enqueued.';
COMMENT ON COLUMN queue.tasks.updated IS 'When it last changed state.';
COMMENT ON COLUMN queue.tasks.started IS 'When the current or last attempt was taken.';
COMMENT ON COLUMN queue.tasks.finished IS 'When it reached its final state; NULL while live.';
COMMENT ON COLUMN queue.tasks.worker IS 'Worker of the current or last attempt.';
COMMENT ON COLUMN queue.tasks.lease_expires IS 'When the running attempt''s lease runs out.';
COMMENT ON COLUMN queue.tasks.group_key IS 'Group (tenant, user, document) counted against the stage''s group_limit, if any.';
COMMENT ON COLUMN queue.tasks.repeat IS 'Interval of a periodic task (live row only; NULL for one-off tasks and for finished rows).';
COMMENT ON COLUMN queue.tasks.run_as IS 'SQL tasks (enqueue_sql): the role that enqueued it and that the request runs as; NULL for ordinary tasks.';
COMMENT ON COLUMN queue.tasks.result IS 'Finished rows: what a done run returned, finish(…, result => …); for SQL tasks the response ({"columns": …, "rows": …, "row_count"}, or {"command": …, "row_count"}). NULL otherwise.';
COMMENT ON COLUMN queue.tasks.progress IS 'Live rows: the latest progress a worker reported, heartbeat(…, progress => …); NULL for none and for finished rows.';
COMMENT ON COLUMN queue.tasks.waits_for IS 'A waiting task: the ids of the tasks it still waits for (enqueue(after => …)); NULL otherwise.';
REVOKE ALL ON queue.tasks FROM PUBLIC;
GRANT SELECT ON queue.tasks TO skiplock_monitor, skiplock_admin;
