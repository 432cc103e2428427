-- Undo 0003: stage_settings loses restricted (stage_access is dropped after it).
ALTER TABLE queue.stage_settings
    DROP COLUMN restricted;
