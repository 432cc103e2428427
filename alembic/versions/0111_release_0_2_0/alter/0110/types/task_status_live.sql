-- The live status 'waiting': a task that waits for others (enqueue(after => …)); the claim index
-- (status IN ('ready', 'error')) skips it.
ALTER TYPE queue.task_status_live ADD VALUE IF NOT EXISTS 'waiting' AFTER 'error';
COMMENT ON TYPE queue.task_status_live IS 'The status of a live task: ready, running, error or waiting (the final ones, in queue.history, are queue.task_status).';
