-- waits (how many awaited tasks are still live) and waited_for (something waits for this task).
-- Constant defaults: no rewrite of the table.
-- Alone in its file: Citus sends a distributed table's ALTER to the shards as the file's text.
ALTER TABLE queue.live_tasks
    ADD COLUMN waits integer NOT NULL DEFAULT 0,
    ADD COLUMN waited_for boolean NOT NULL DEFAULT false;
