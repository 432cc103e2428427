-- queue.stage_settings gains task_timeout (a worker's time limit for one attempt; NULL: none), and
-- configure_stage an argument of that name: its 11-argument form is dropped so that the 12-argument
-- one that follows does not sit beside it (a call naming only the old arguments would be ambiguous).
ALTER TABLE queue.stage_settings
    ADD COLUMN IF NOT EXISTS task_timeout interval
        CONSTRAINT stage_settings_task_timeout_positive CHECK (task_timeout > interval '0');
COMMENT ON COLUMN queue.stage_settings.task_timeout IS 'How long a worker lets one attempt run before it kills it and fails the attempt (skiplock worker, the reference clients; read with queue.task_timeout). NULL: no limit.';
DROP FUNCTION IF EXISTS queue.configure_stage(text, interval, integer, text, interval, interval, real, boolean, integer, integer, boolean);
