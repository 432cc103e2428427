-- Peers, W2b, Graphile Worker: take a batch (its worker's getJobs with a batch size: the named
-- queues' CTE, the whole job rows sent to the worker) and complete the batch with one DELETE over
-- the ids, as its batched completion does. Each row carries the batch's count and ids (\aset keeps
-- the last row's; n stays 0 when nothing was due). Variables: tasks, worker, batch.
\set n 0
WITH j AS (
  SELECT jobs.job_queue_id, jobs.priority, jobs.run_at, jobs.id
    FROM graphile_worker._private_jobs AS jobs
   WHERE jobs.is_available AND jobs.run_at <= now() AND jobs.task_id = ANY (:tasks::int[])
     AND (jobs.job_queue_id IS NULL
          OR jobs.job_queue_id IN (SELECT id FROM graphile_worker._private_job_queues
                                    WHERE is_available FOR UPDATE SKIP LOCKED))
   ORDER BY jobs.priority, jobs.run_at
   LIMIT :batch
   FOR UPDATE SKIP LOCKED),
q AS (
  UPDATE graphile_worker._private_job_queues AS job_queues
     SET locked_by = :worker, locked_at = now()
    FROM j WHERE job_queues.id = j.job_queue_id),
taken AS (
  UPDATE graphile_worker._private_jobs AS jobs
     SET attempts = jobs.attempts + 1, locked_by = :worker, locked_at = now()
    FROM j WHERE jobs.id = j.id
  RETURNING jobs.*)
SELECT count(*) OVER () AS n, array_agg(taken.id) OVER () AS ids, taken.* FROM taken
\aset
\if :n > 0
DELETE FROM graphile_worker._private_jobs WHERE id = ANY (:ids::bigint[]);
\else
\sleep 10 ms
\endif
