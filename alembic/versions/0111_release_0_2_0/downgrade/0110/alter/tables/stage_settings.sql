-- queue.stage_settings loses 0110's rate limit, weight and task_timeout columns (their checks go with them).
ALTER TABLE queue.stage_settings
    DROP COLUMN rate_limit,
    DROP COLUMN rate_window,
    DROP COLUMN rate_burst,
    DROP COLUMN rate_per_group,
    DROP COLUMN weight,
    DROP COLUMN task_timeout;
