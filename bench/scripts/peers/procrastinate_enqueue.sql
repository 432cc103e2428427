-- Peers, W1, Procrastinate: one job a transaction through its defer procedure
-- (procrastinate_defer_jobs_v1 over an array of procrastinate_job_to_defer_v1, as its defer sends it).
SELECT unnest(procrastinate_defer_jobs_v1(
         ARRAY[ROW('default', 'noop', 0, NULL, NULL, '{"doc": 42}'::jsonb, NULL)::procrastinate_job_to_defer_v1])) AS id;
