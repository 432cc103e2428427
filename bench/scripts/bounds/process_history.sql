-- Bound, W2: the statements take_locked and finish_locked run, as bare SQL with no function: the
-- claim by the claim index with FOR UPDATE SKIP LOCKED, then the move to queue.history, one
-- transaction, the move and COMMIT in one round trip (as process_locked.sql). No settings, no
-- access check, no claim position, no fence: the floor under that loop. Variables: stage.
BEGIN;
SELECT coalesce((SELECT t.id FROM queue.live_tasks t
                  WHERE t.stage = :stage AND t.status IN ('ready', 'error') AND t.run_as IS NULL
                    AND t.run_at <= now()
                  ORDER BY t.priority, t.run_at, t.id
                  LIMIT 1 FOR UPDATE SKIP LOCKED), 0) AS id
\gset
\if :id = 0
ROLLBACK;
\sleep 10 ms
\else
\startpipeline
WITH d AS (DELETE FROM queue.live_tasks t WHERE t.id = :id AND t.stage = :stage RETURNING t.*)
INSERT INTO queue.history
SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt + 1, NULL, NULL, now(), clock_timestamp())).*
  FROM d;
COMMIT;
\endpipeline
\endif
