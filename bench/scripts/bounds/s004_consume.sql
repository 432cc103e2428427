-- Bound, seed 004's consume: the statement queue.consume runs, for a random tenant's stage, with no
-- function around it (no checks, no settings, no wake-up mark): the floor under
-- skiplock004_consume.sql. Variables: batch.
\set uid random(1,1000)
WITH done AS (
    DELETE FROM queue.live_tasks t
     WHERE t.stage = 's004.' || :uid AND t.ctid = ANY (ARRAY(
               SELECT c.ctid FROM queue.live_tasks c
                WHERE c.stage = 's004.' || :uid AND c.status IN ('ready', 'error') AND c.run_as IS NULL
                  AND c.repeat IS NULL AND c.run_at <= now()
                ORDER BY c.priority, c.run_at, c.id
                LIMIT :batch FOR UPDATE SKIP LOCKED))
    RETURNING t.*
), recorded AS (
    INSERT INTO queue.history
    SELECT (queue._history_row(d::queue.live_tasks, 'done', d.attempt + 1, NULL, d.error_text, now(), clock_timestamp())).*
      FROM done d
    RETURNING 1
)
SELECT count(*) FROM done;
