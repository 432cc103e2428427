-- Last, once nothing reads it: queue.stage_settings loses task_timeout.
ALTER TABLE queue.stage_settings DROP COLUMN IF EXISTS task_timeout;
