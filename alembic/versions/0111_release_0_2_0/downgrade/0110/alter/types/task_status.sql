-- Back to 0109's comment. PostgreSQL cannot drop a value of an enum: 'waiting' stays in the
-- type, unused (no live task has it after the downgrade of live_tasks).
COMMENT ON TYPE queue.task_status IS 'ready: waiting (run_at may be in the future); running: taken, under a lease; error: failed, a retry is scheduled at run_at; done, fatal (failed, never retried), cancelled: final, in queue.history.';
