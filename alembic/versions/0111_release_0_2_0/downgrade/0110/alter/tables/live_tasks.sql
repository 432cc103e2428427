ALTER TABLE queue.live_tasks DROP COLUMN IF EXISTS progress;
