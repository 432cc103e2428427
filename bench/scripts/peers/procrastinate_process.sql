-- Peers, W2, Procrastinate: its worker's loop: procrastinate_fetch_job_v2 (any queue, as a worker
-- started without a queue list asks), then procrastinate_finish_job_v1(id, 'succeeded', false):
-- the job stays in procrastinate_jobs as succeeded (its default, delete_jobs "never"). Two calls,
-- two commits. Variables: worker_id (registered with procrastinate_register_worker_v1).
SELECT coalesce((SELECT id FROM procrastinate_fetch_job_v2(NULL::varchar[], :worker_id::bigint)), 0) AS id
\gset
\if :id > 0
SELECT procrastinate_finish_job_v1(:id::bigint, 'succeeded', false);
\else
\sleep 10 ms
\endif
