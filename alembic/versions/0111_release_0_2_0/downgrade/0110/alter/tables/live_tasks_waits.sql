-- Back to 0109: without waits (the tasks waiting for others became ready first).
-- Alone in its file: Citus sends a distributed table's ALTER to the shards as the file's text.
-- squawk-ignore ban-drop-column
ALTER TABLE queue.live_tasks DROP COLUMN waits;
