-- history: the stage's history mode when the task was enqueued (NULL: all). No default and
-- nullable: no rewrite of the table, every task already there keeps all history, as before.
-- Alone in its file: Citus sends a distributed table's ALTER to the shards as the file's text.
ALTER TABLE queue.live_tasks ADD COLUMN history text;
