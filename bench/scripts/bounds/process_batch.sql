-- Bound, W2b: the statement of consume(stage, batch) as bare SQL: claim up to :batch due tasks with
-- FOR UPDATE SKIP LOCKED and move them to queue.history by their row addresses, one statement, one
-- transaction. No settings, no argument checks, no function: the floor under a per-task record of a
-- batch. Its LIMIT is written out, 100 (bench.peers' batch): a LIMIT parameter would have the plan
-- cache plan every call, as consume did before it kept one generic plan. Variables: stage.
WITH d AS (
  DELETE FROM queue.live_tasks t
   WHERE t.stage = :stage AND t.ctid = ANY (ARRAY(
           SELECT c.ctid FROM queue.live_tasks c
            WHERE c.stage = :stage AND c.status IN ('ready', 'error') AND c.run_as IS NULL
              AND c.repeat IS NULL AND c.run_at <= now()
            ORDER BY c.priority, c.run_at, c.id
            LIMIT 100 FOR UPDATE SKIP LOCKED))
  RETURNING t.*),
i AS (INSERT INTO queue.history
      SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt + 1, NULL, d.error_text, now(), clock_timestamp())).*
        FROM d
      RETURNING 1)
SELECT count(*) AS n FROM i
\gset
\if :n = 0
\sleep 10 ms
\endif
