-- Undo 0005: the comment of stage_settings.notify as it was.
COMMENT ON COLUMN queue.stage_settings.notify IS 'Whether enqueue sends NOTIFY on channel skiplock.<stage> to wake idle workers. Turn off for very high enqueue rates: NOTIFY serialises commits.';
