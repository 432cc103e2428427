-- Bound, W2, no history: as process_history.sql, but the finish only deletes the task (Graphile
-- Worker's completion): what the loop would cost if skiplock kept no record of finished attempts.
-- Variables: stage.
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
DELETE FROM queue.live_tasks t WHERE t.id = :id AND t.stage = :stage;
COMMIT;
\endpipeline
\endif
