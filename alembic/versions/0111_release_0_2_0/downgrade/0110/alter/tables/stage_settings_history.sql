-- queue.stage_settings loses history (its check goes with it).
-- squawk-ignore ban-drop-column
ALTER TABLE queue.stage_settings DROP COLUMN history;
