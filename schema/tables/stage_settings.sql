CREATE TABLE queue.stage_settings (
    stage           text        NOT NULL PRIMARY KEY
                                CONSTRAINT stage_settings_stage_named CHECK (stage = '*' OR (octet_length(stage) BETWEEN 1 AND 54)),
    lease_duration  interval    NOT NULL DEFAULT interval '5 minutes'
                                CONSTRAINT stage_settings_lease_positive CHECK (lease_duration > interval '0'),
    max_attempts    integer     NOT NULL DEFAULT 5
                                CONSTRAINT stage_settings_max_attempts_positive CHECK (max_attempts >= 1),
    backoff         text        NOT NULL DEFAULT 'exponential'
                                CONSTRAINT stage_settings_backoff_known CHECK (backoff IN ('linear', 'exponential')),
    backoff_base    interval    NOT NULL DEFAULT interval '10 seconds'
                                CONSTRAINT stage_settings_backoff_base_not_negative CHECK (backoff_base >= interval '0'),
    backoff_cap     interval    NOT NULL DEFAULT interval '1 hour'
                                CONSTRAINT stage_settings_backoff_cap_not_negative CHECK (backoff_cap >= interval '0'),
    backoff_jitter  real        NOT NULL DEFAULT 0.1
                                CONSTRAINT stage_settings_jitter_fraction CHECK (backoff_jitter >= 0 AND backoff_jitter <= 1),
    notify          boolean     NOT NULL DEFAULT true,
    updated         timestamptz NOT NULL DEFAULT now(),
    max_running     integer
                                CONSTRAINT stage_settings_max_running_positive CHECK (max_running >= 1),
    group_limit     integer
                                CONSTRAINT stage_settings_group_limit_positive CHECK (group_limit >= 1),
    paused          boolean     NOT NULL DEFAULT false,
    restricted      boolean     NOT NULL DEFAULT false,
    rate_limit      integer
                                CONSTRAINT stage_settings_rate_limit_positive CHECK (rate_limit >= 1),
    rate_window     interval    NOT NULL DEFAULT interval '1 second'
                                CONSTRAINT stage_settings_rate_window_range CHECK (rate_window >= interval '1 millisecond' AND rate_window <= interval '31 days'
                                                                                  AND EXTRACT(month FROM rate_window) = 0),
    rate_burst      integer
                                CONSTRAINT stage_settings_rate_burst_range CHECK (rate_burst >= 1 AND rate_burst <= rate_limit),
    rate_per_group  boolean     NOT NULL DEFAULT false,
    weight          integer     NOT NULL DEFAULT 1
                                CONSTRAINT stage_settings_weight_range CHECK (weight BETWEEN 1 AND 1000),
    task_timeout    interval
                                CONSTRAINT stage_settings_task_timeout_positive CHECK (task_timeout > interval '0'),
    -- NULL keeps all history. A stage's own: enqueue reads only the stage's row, never '*'.
    history         text
                                CONSTRAINT stage_settings_history_known CHECK (history IS NULL OR (history IN ('failures', 'none') AND stage <> '*'))
);

-- The row for stage '*' holds the defaults of every stage that has no row of its own.
INSERT INTO queue.stage_settings (stage) VALUES ('*');

COMMENT ON TABLE queue.stage_settings IS 'Per-stage policy (lease, retries, wake-ups, concurrency limits). A stage without a row uses the row of stage ''*''. Change with queue.configure_stage() (role skiplock_admin); a superuser may also UPDATE it in psql.';
COMMENT ON COLUMN queue.stage_settings.stage IS 'Stage name, or ''*'' for the defaults of stages that have no row.';
COMMENT ON COLUMN queue.stage_settings.lease_duration IS 'How long a taken task stays leased to its worker before reap_hung() may recover it, unless heartbeat() extends it.';
COMMENT ON COLUMN queue.stage_settings.max_attempts IS 'Attempts before a failing task becomes fatal (1 = never retried).';
COMMENT ON COLUMN queue.stage_settings.backoff IS 'linear: backoff_base * attempt; exponential: backoff_base * 2^(attempt-1).';
COMMENT ON COLUMN queue.stage_settings.backoff_base IS 'First retry delay, the unit of the backoff.';
COMMENT ON COLUMN queue.stage_settings.backoff_cap IS 'Longest retry delay.';
COMMENT ON COLUMN queue.stage_settings.backoff_jitter IS 'Random spread of the retry delay, as a fraction of it (0.1 = plus or minus 10 %), so failed tasks do not retry in lockstep.';
COMMENT ON COLUMN queue.stage_settings.notify IS 'Whether enqueue sends NOTIFY on channel skiplock.<stage> to wake idle workers (only while one waits: queue.stage_waiters). Turn off for very high enqueue rates into a stage whose workers often wait: NOTIFY serialises commits.';
COMMENT ON COLUMN queue.stage_settings.updated IS 'When this row was last changed.';
COMMENT ON COLUMN queue.stage_settings.max_running IS 'At most this many tasks of the stage run at once; take_next hands out no more. NULL: no cap. A capped stage serialises its takers (see take_next).';
COMMENT ON COLUMN queue.stage_settings.group_limit IS 'At most this many tasks of one group_key run at once in the stage (1: one at a time per group, in claim order); tasks without a group_key are not counted. NULL: no cap.';
COMMENT ON COLUMN queue.stage_settings.paused IS 'While true, take_next hands out no task of the stage (enqueue, finish, fail and reap_hung go on): a pause that holds whatever workers do.';
COMMENT ON COLUMN queue.stage_settings.rate_limit IS 'At most this many tasks of the stage (of each group_key, with rate_per_group) are taken per rate_window; windows start at multiples of rate_window since the Unix epoch. NULL: no limit. A limited stage serialises its takers.';
COMMENT ON COLUMN queue.stage_settings.rate_window IS 'The window of rate_limit (1 ms to 31 days): interval ''1 second'', ''1 minute'', ''1 hour''.';
COMMENT ON COLUMN queue.stage_settings.rate_burst IS 'At most this many of a window''s rate_limit tasks in each part of rate_window * rate_burst / rate_limit, spreading them over the window. NULL: rate_limit (the whole window''s share at once).';
COMMENT ON COLUMN queue.stage_settings.rate_per_group IS 'Whether rate_limit applies to each group_key on its own (tasks without a group_key are not limited) rather than to the whole stage.';
COMMENT ON COLUMN queue.stage_settings.weight IS 'A multi-stage take (take_next(stages[]), take_locked, consume) serves this many tasks of the stage in its turn of the round robin (1 to 1000).';
COMMENT ON COLUMN queue.stage_settings.task_timeout IS 'How long a worker lets one attempt run before it kills it and fails the attempt (skiplock worker, the reference clients; read with queue.task_timeout). NULL: no limit.';
COMMENT ON COLUMN queue.stage_settings.history IS 'What queue.history keeps of the stage''s ended tasks: NULL, all; ''failures'', only fatal ends; ''none'', nothing. Runs not kept are counted in queue.finished_counts. Stamped on each task at enqueue.';
COMMENT ON COLUMN queue.stage_settings.restricted IS 'Whether queue.stage_access has rows for the stage (kept by grant_stage and revoke_stage): only then do enqueue and take_next look up the caller''s rights, so open stages pay nothing. grant_stage never sets it on ''*''.';
