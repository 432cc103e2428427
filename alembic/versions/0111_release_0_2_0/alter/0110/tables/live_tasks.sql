-- heartbeat(…, progress): the latest progress of a live task. A new nullable column without a default: no rewrite.
-- One DO block: on Citus an ALTER TABLE sends its whole query string to the nodes, which
-- refuse several commands in one (each statement of a block is a query string of its own).
DO $$
BEGIN
    ALTER TABLE queue.live_tasks ADD COLUMN IF NOT EXISTS progress jsonb;
    COMMENT ON COLUMN queue.live_tasks.progress IS 'The latest progress a worker reported, heartbeat(…, progress => …): a JSON object or array of at most 1 MiB. Kept when an attempt fails or is released, cleared when the task moves to another stage or re-arms.';
END
$$;
