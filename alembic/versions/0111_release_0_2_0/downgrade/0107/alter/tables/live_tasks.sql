-- Back to 0106: the CHECK live_tasks_valid (validated against the rows written since).
-- Alone in its file: Citus sends a distributed table's ALTER to the shards as the file's text.
ALTER TABLE queue.live_tasks
    ADD CONSTRAINT live_tasks_valid
        CHECK (queue._live_row_ok(status, attempt, lease, lease_expires, started, rerun, repeat, slot, group_key));
