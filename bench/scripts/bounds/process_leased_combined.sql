-- Bound, W2: the statements finish_and_take runs, as bare SQL with no function: the move to
-- queue.history of the task the previous iteration took (by its lease), then the claim of the next
-- under a new lease, one transaction, one round trip and one commit a task, as
-- process_combined.sql. No settings, access check, claim position or argument checks: the floor
-- under the finish_and_take loop. Variables: stage, id, lease (initially 0 and zero).
WITH d AS (DELETE FROM queue.live_tasks t
            WHERE t.id = :id AND t.stage = :stage AND t.lease = :lease::uuid AND t.status = 'running'
           RETURNING t.*),
     h AS (INSERT INTO queue.history
           SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt, d.worker, d.error_text, d.started, now())).*
             FROM d),
     u AS (UPDATE queue.live_tasks t
              SET status = 'running', attempt = t.attempt + 1, lease = gen_random_uuid(),
                  lease_expires = now() + interval '5 minutes', started = now(), updated = now(), worker = 'bound'
            WHERE t.stage = :stage AND t.id = (SELECT c.id FROM queue.live_tasks c
                                                WHERE c.stage = :stage AND c.status IN ('ready', 'error')
                                                  AND c.run_as IS NULL AND c.run_at <= now()
                                                ORDER BY c.priority, c.run_at, c.id
                                                LIMIT 1 FOR UPDATE SKIP LOCKED)
           RETURNING t.id, t.lease)
SELECT coalesce(u.id, 0) AS id, coalesce(u.lease, '00000000-0000-0000-0000-000000000000') AS lease
  FROM (VALUES (1)) AS one LEFT JOIN u ON true
\gset
\if :id = 0
\sleep 10 ms
\endif
