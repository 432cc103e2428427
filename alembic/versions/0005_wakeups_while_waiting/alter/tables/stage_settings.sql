-- 0005: only the comment of stage_settings.notify changed (NOTIFY is sent while a worker waits).
COMMENT ON COLUMN queue.stage_settings.notify IS 'Whether enqueue sends NOTIFY on channel skiplock.<stage> to wake idle workers (only while one waits: queue.stage_waiters). Turn off for very high enqueue rates into a stage whose workers often wait: NOTIFY serialises commits.';
