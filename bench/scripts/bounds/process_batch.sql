-- Bound, W2b: the statements of a batch take_locked + finish, as bare SQL: claim up to :batch tasks
-- with FOR UPDATE SKIP LOCKED and move them to queue.history in one statement, one transaction (a
-- single statement is one). No leases, no fence, no settings: the floor under a per-task record of a
-- batch. Variables: stage, batch.
WITH c AS (
  SELECT t.id FROM queue.live_tasks t
   WHERE t.stage = :stage AND t.status IN ('ready', 'error') AND t.run_as IS NULL AND t.run_at <= now()
   ORDER BY t.priority, t.run_at, t.id
   LIMIT :batch FOR UPDATE SKIP LOCKED),
d AS (DELETE FROM queue.live_tasks t USING c WHERE t.id = c.id AND t.stage = :stage RETURNING t.*),
i AS (INSERT INTO queue.history
      SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt + 1, NULL, NULL, now(), clock_timestamp())).*
        FROM d
      RETURNING 1)
SELECT count(*) AS n FROM i
\gset
\if :n = 0
\sleep 10 ms
\endif
