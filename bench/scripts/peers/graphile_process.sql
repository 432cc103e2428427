-- Peers, W2, Graphile Worker: take one job and complete it, two statements and two commits, shaped
-- after what its worker sends (0.17: getJobs claims by SKIP LOCKED, locks the job's named queue in
-- a second CTE, sets locked_at/locked_by, counts the attempt and returns the whole job row, payload
-- included, which its worker reads; completion deletes the row). Written for this benchmark from
-- its documented behaviour. \aset leaves id at 0 when nothing was due. Variables: tasks (an array
-- of the id of the 'noop' task identifier), worker.
\set id 0
WITH j AS (
  SELECT jobs.job_queue_id, jobs.priority, jobs.run_at, jobs.id
    FROM graphile_worker._private_jobs AS jobs
   WHERE jobs.is_available AND jobs.run_at <= now() AND jobs.task_id = ANY (:tasks::int[])
     AND (jobs.job_queue_id IS NULL
          OR jobs.job_queue_id IN (SELECT id FROM graphile_worker._private_job_queues
                                    WHERE is_available FOR UPDATE SKIP LOCKED))
   ORDER BY jobs.priority, jobs.run_at
   LIMIT 1
   FOR UPDATE SKIP LOCKED),
q AS (
  UPDATE graphile_worker._private_job_queues AS job_queues
     SET locked_by = :worker, locked_at = now()
    FROM j WHERE job_queues.id = j.job_queue_id)
UPDATE graphile_worker._private_jobs AS jobs
   SET attempts = jobs.attempts + 1, locked_by = :worker, locked_at = now()
  FROM j WHERE jobs.id = j.id
RETURNING jobs.*
\aset
\if :id > 0
DELETE FROM graphile_worker._private_jobs WHERE id = :id;
\else
\sleep 10 ms
\endif
