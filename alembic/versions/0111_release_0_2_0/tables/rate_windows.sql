-- What the takes of a rate-limited stage (stage_settings.rate_limit) have counted in the current
-- window: one row for the stage (group_key ''), or one per group_key with rate_per_group. take_next
-- reads and writes them holding the stage's advisory lock, in the transaction of its claim, so the
-- count and the claim commit together. A row of an older window counts as empty; rows are
-- overwritten, never piled up (one a group that ever ran in the stage).
CREATE TABLE queue.rate_windows (
    stage        text        NOT NULL,
    group_key    text        NOT NULL,
    window_start timestamptz NOT NULL,
    taken        integer     NOT NULL CONSTRAINT rate_windows_taken_positive CHECK (taken >= 1),
    burst_start  timestamptz NOT NULL,
    burst_taken  integer     NOT NULL CONSTRAINT rate_windows_burst_taken_positive CHECK (burst_taken >= 1),
    CONSTRAINT rate_windows_pkey PRIMARY KEY (stage, group_key)
);

COMMENT ON TABLE queue.rate_windows IS 'Tasks taken in the current rate window of each rate-limited stage (group_key ''''), or of each of its groups (rate_per_group). Written by take_next under the stage''s advisory lock; an older window counts as empty.';
COMMENT ON COLUMN queue.rate_windows.stage IS 'The rate-limited stage.';
COMMENT ON COLUMN queue.rate_windows.group_key IS 'The group counted (rate_per_group), or '''' for the whole stage.';
COMMENT ON COLUMN queue.rate_windows.window_start IS 'Start of the window counted in taken (a multiple of rate_window since the Unix epoch).';
COMMENT ON COLUMN queue.rate_windows.taken IS 'Tasks taken since window_start.';
COMMENT ON COLUMN queue.rate_windows.burst_start IS 'Start of the burst part of the window counted in burst_taken (see stage_settings.rate_burst).';
COMMENT ON COLUMN queue.rate_windows.burst_taken IS 'Tasks taken since burst_start.';
GRANT SELECT ON queue.rate_windows TO skiplock_admin, skiplock_monitor;
