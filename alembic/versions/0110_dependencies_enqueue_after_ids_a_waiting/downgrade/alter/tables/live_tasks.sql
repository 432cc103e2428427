-- Back to 0109: without waits and waited_for (the tasks waiting for others become ready first).
-- Alone in its file: Citus sends a distributed table's ALTER to the shards as the file's text.
-- squawk-ignore ban-drop-column
ALTER TABLE queue.live_tasks
    DROP COLUMN waits,
    DROP COLUMN waited_for;
