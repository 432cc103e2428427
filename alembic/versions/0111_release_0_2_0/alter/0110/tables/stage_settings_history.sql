-- queue.stage_settings gains history, the stage's history mode (NULL: all; '*' always all).
-- One DO block: on Citus an ALTER TABLE sends its whole query string to the nodes, which
-- refuse several commands in one (each statement of a block is a query string of its own).
DO $$
BEGIN
    ALTER TABLE queue.stage_settings
        ADD COLUMN history text
            CONSTRAINT stage_settings_history_known CHECK (history IS NULL OR (history IN ('failures', 'none') AND stage <> '*'));
    COMMENT ON COLUMN queue.stage_settings.history IS 'What queue.history keeps of the stage''s ended tasks: NULL, all; ''failures'', only fatal ends; ''none'', nothing. Runs not kept are counted in queue.finished_counts. Stamped on each task at enqueue.';
END
$$;
