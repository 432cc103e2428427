-- The live status 'waiting' (enqueue(after => …)), also in the type queue.tasks shows. Not used
-- in this migration's transaction (PostgreSQL refuses a value added in the same transaction).
ALTER TYPE queue.task_status ADD VALUE IF NOT EXISTS 'waiting' AFTER 'error';
COMMENT ON TYPE queue.task_status IS 'ready: may be taken once run_at has come; running: under a lease; error: failed, a retry is scheduled at run_at; waiting: for other tasks to end (enqueue(after => …)); done, fatal (failed, never retried), cancelled: final, in queue.history.';
