-- Peers, W2, Graphile Worker: take one job and complete it, two statements and two commits, shaped
-- after what its worker sends (a claim by SKIP LOCKED that sets locked_at/locked_by and counts the
-- attempt; completion deletes the row). Written for this benchmark from its documented behaviour.
-- Variables: tasks (an array of the id of the 'noop' task identifier), worker.
WITH j AS (
  SELECT id FROM graphile_worker._private_jobs
   WHERE is_available AND run_at <= now() AND task_id = ANY (:tasks::int[])
     AND (job_queue_id IS NULL
          OR job_queue_id IN (SELECT id FROM graphile_worker._private_job_queues
                               WHERE is_available FOR UPDATE SKIP LOCKED))
   ORDER BY priority, run_at
   LIMIT 1
   FOR UPDATE SKIP LOCKED),
taken AS (
  UPDATE graphile_worker._private_jobs AS jobs
     SET attempts = jobs.attempts + 1, locked_by = :worker, locked_at = now()
    FROM j WHERE jobs.id = j.id
  RETURNING jobs.*)
SELECT coalesce(max(id), 0) AS id FROM taken
\gset
\if :id > 0
DELETE FROM graphile_worker._private_jobs WHERE id = :id;
\else
\sleep 10 ms
\endif
