CREATE TYPE queue.task_status AS ENUM ('ready', 'running', 'error', 'waiting', 'done', 'fatal', 'cancelled');
COMMENT ON TYPE queue.task_status IS 'ready: may be taken once run_at has come; running: under a lease; error: failed, a retry is scheduled at run_at; waiting: for other tasks to end (enqueue(after => …)); done, fatal (failed, never retried), cancelled: final, in queue.history.';
