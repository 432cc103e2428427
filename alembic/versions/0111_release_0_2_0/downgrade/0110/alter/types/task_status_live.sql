-- Back to 0109's comment. PostgreSQL cannot drop a value of an enum: 'waiting' stays in the
-- type, unused (no live task has it after the downgrade of live_tasks).
COMMENT ON TYPE queue.task_status_live IS 'The status of a live task: ready, running or error (the final ones, in queue.history, are queue.task_status).';
