-- waits: above 0, how many awaited tasks are still live (status 'waiting'); -1, something waits
-- for this task; 0, neither. A constant default: no rewrite of the table.
-- Alone in its file: Citus sends a distributed table's ALTER to the shards as the file's text.
ALTER TABLE queue.live_tasks ADD COLUMN waits integer NOT NULL DEFAULT 0;
