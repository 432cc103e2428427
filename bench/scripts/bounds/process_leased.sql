-- Bound, W2: the statements take_next and finish run, as bare SQL with no function: the claim
-- marks the task running under a new lease (its own transaction), then the move to queue.history
-- checks the lease (another). The same round trips as process.sql; no settings, access check,
-- claim position or argument checks: the floor under the take_next + finish loop. Variables: stage.
WITH u AS (
    UPDATE queue.live_tasks t
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
\if :id > 0
WITH d AS (DELETE FROM queue.live_tasks t
            WHERE t.id = :id AND t.stage = :stage AND t.lease = :lease AND t.status = 'running'
           RETURNING t.*)
INSERT INTO queue.history
SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt, d.worker, d.error_text, d.started, now())).*
  FROM d;
\else
\sleep 10 ms
\endif
