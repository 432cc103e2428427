CREATE TYPE queue.task_status AS ENUM ('ready', 'running', 'error', 'done', 'fatal', 'cancelled');
COMMENT ON TYPE queue.task_status IS 'ready: waiting (run_at may be in the future); running: taken, under a lease; error: failed, a retry is scheduled at run_at; done, fatal (failed, never retried), cancelled: final, in queue.history.';
