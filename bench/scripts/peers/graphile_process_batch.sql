-- Peers, W2b, Graphile Worker: take a batch (its worker's getJobs with a batch size) and complete
-- the batch with one DELETE over the ids, as its batched completion does. Variables: tasks, worker, batch.
WITH j AS (
  SELECT id FROM graphile_worker._private_jobs
   WHERE is_available AND run_at <= now() AND task_id = ANY (:tasks::int[])
     AND (job_queue_id IS NULL
          OR job_queue_id IN (SELECT id FROM graphile_worker._private_job_queues
                               WHERE is_available FOR UPDATE SKIP LOCKED))
   ORDER BY priority, run_at
   LIMIT :batch
   FOR UPDATE SKIP LOCKED),
taken AS (
  UPDATE graphile_worker._private_jobs AS jobs
     SET attempts = jobs.attempts + 1, locked_by = :worker, locked_at = now()
    FROM j WHERE jobs.id = j.id
  RETURNING jobs.*)
SELECT count(*) AS n, coalesce(array_agg(id), '{}') AS ids FROM taken
\gset
\if :n > 0
DELETE FROM graphile_worker._private_jobs WHERE id = ANY (:ids::bigint[]);
\else
\sleep 10 ms
\endif
