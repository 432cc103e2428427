-- Back to before history modes: live_tasks without history (every task keeps all history again).
-- Alone in its file: Citus sends a distributed table's ALTER to the shards as the file's text.
-- squawk-ignore ban-drop-column
ALTER TABLE queue.live_tasks DROP COLUMN history;
