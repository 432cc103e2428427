-- queue.stage_settings gains the rate limit (rate_limit per rate_window, rate_burst, rate_per_group)
-- and the weight of a stage in multi-stage takes. New columns at the end, in schema/'s order; the
-- table holds a row a configured stage, so its checks are validated at once.
-- One DO block: on Citus an ALTER TABLE sends its whole query string to the nodes, which
-- refuse several commands in one (each statement of a block is a query string of its own).
DO $$
BEGIN
    ALTER TABLE queue.stage_settings
        ADD COLUMN rate_limit integer
            CONSTRAINT stage_settings_rate_limit_positive CHECK (rate_limit >= 1),
        ADD COLUMN rate_window interval NOT NULL DEFAULT interval '1 second'
            CONSTRAINT stage_settings_rate_window_range CHECK (rate_window >= interval '1 millisecond' AND rate_window <= interval '31 days'
                                                              AND EXTRACT(month FROM rate_window) = 0),
        ADD COLUMN rate_burst integer
            CONSTRAINT stage_settings_rate_burst_range CHECK (rate_burst >= 1 AND rate_burst <= rate_limit),
        ADD COLUMN rate_per_group boolean NOT NULL DEFAULT false,
        ADD COLUMN weight integer NOT NULL DEFAULT 1
            CONSTRAINT stage_settings_weight_range CHECK (weight BETWEEN 1 AND 1000);
    COMMENT ON COLUMN queue.stage_settings.rate_limit IS 'At most this many tasks of the stage (of each group_key, with rate_per_group) are taken per rate_window; windows start at multiples of rate_window since the Unix epoch. NULL: no limit. A limited stage serialises its takers.';
    COMMENT ON COLUMN queue.stage_settings.rate_window IS 'The window of rate_limit (1 ms to 31 days): interval ''1 second'', ''1 minute'', ''1 hour''.';
    COMMENT ON COLUMN queue.stage_settings.rate_burst IS 'At most this many of a window''s rate_limit tasks in each part of rate_window * rate_burst / rate_limit, spreading them over the window. NULL: rate_limit (the whole window''s share at once).';
    COMMENT ON COLUMN queue.stage_settings.rate_per_group IS 'Whether rate_limit applies to each group_key on its own (tasks without a group_key are not limited) rather than to the whole stage.';
    COMMENT ON COLUMN queue.stage_settings.weight IS 'A multi-stage take (take_next(stages[]), take_locked, consume) serves this many tasks of the stage in its turn of the round robin (1 to 1000).';
    -- And task_timeout: a worker's time limit for one attempt (NULL: none).
    ALTER TABLE queue.stage_settings
        ADD COLUMN task_timeout interval
            CONSTRAINT stage_settings_task_timeout_positive CHECK (task_timeout > interval '0');
    COMMENT ON COLUMN queue.stage_settings.task_timeout IS 'How long a worker lets one attempt run before it kills it and fails the attempt (skiplock worker, the reference clients; read with queue.task_timeout). NULL: no limit.';
END
$$;
