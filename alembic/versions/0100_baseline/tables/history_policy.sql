-- How queue.history is partitioned and for how long finished tasks are kept: one row, read by
-- queue.rotate_partitions() and queue.maintain(), changed with queue.configure_history().
-- Partitions are periods of UTC time aligned to the interval (days start at 00:00 UTC, weeks on
-- Monday 00:00 UTC), so what rotation creates never depends on the session's TimeZone.
CREATE TABLE queue.history_policy (
    one                 boolean     NOT NULL DEFAULT true PRIMARY KEY
                                    CONSTRAINT history_policy_one_row CHECK (one),
    partition_interval  interval    NOT NULL DEFAULT interval '1 day'
                                    CONSTRAINT history_policy_interval_divides CHECK (partition_interval IN (
                                        interval '1 hour', interval '2 hours', interval '3 hours',
                                        interval '4 hours', interval '6 hours', interval '8 hours',
                                        interval '12 hours', interval '1 day', interval '7 days')),
    premake             integer     NOT NULL DEFAULT 7
                                    CONSTRAINT history_policy_premake_range CHECK (premake BETWEEN 1 AND 1000),
    retention           interval    NOT NULL DEFAULT interval '30 days',
    retention_action    text        NOT NULL DEFAULT 'drop'
                                    CONSTRAINT history_policy_retention_action_known CHECK (retention_action IN ('drop', 'detach')),
    rotate_every        interval    NOT NULL DEFAULT interval '10 minutes'
                                    CONSTRAINT history_policy_rotate_every_positive CHECK (rotate_every > interval '0'),
    last_rotated        timestamptz,
    updated             timestamptz NOT NULL DEFAULT now(),
    -- A partition goes only when its whole range is older than the retention: at least one period.
    CONSTRAINT history_policy_retention_covers_interval CHECK (retention >= partition_interval),
    -- Rotating less often than the premade periods last would let finishes run past them (into
    -- the default partition) between two rotations.
    CONSTRAINT history_policy_rotate_within_premake CHECK (rotate_every < partition_interval * premake)
);

-- The one row, with the defaults; never deleted (configure_history updates it).
INSERT INTO queue.history_policy (one) VALUES (true);

COMMENT ON TABLE queue.history_policy IS 'One row: how queue.history is partitioned (UTC periods), how far ahead partitions are made, how long finished tasks are kept, how often maintain() rotates. Change with queue.configure_history() (role skiplock_admin).';
COMMENT ON COLUMN queue.history_policy.one IS 'Always true: the primary key that keeps this table to one row.';
COMMENT ON COLUMN queue.history_policy.partition_interval IS 'Length of a history partition: 1, 2, 3, 4, 6, 8 or 12 hours (periods that divide a UTC day), 1 day, or 7 days (weeks from Monday 00:00 UTC). A change applies to periods not yet covered by a partition.';
COMMENT ON COLUMN queue.history_policy.premake IS 'How many periods after the current one rotate_partitions() keeps partitioned ahead (1 to 1000). Keep premake * partition_interval well above an hour (nearer partitions lock finishes out while attached); past them, the default partition catches rows.';
COMMENT ON COLUMN queue.history_policy.retention IS 'How long finished tasks are kept: a partition goes once its whole range is older than now - retention (computed in UTC), so rows stay between retention and retention + partition_interval. At least partition_interval.';
COMMENT ON COLUMN queue.history_policy.retention_action IS 'drop: expired partitions are dropped; detach: they are detached and left in schema queue as plain tables (same name) for you to archive and drop.';
COMMENT ON COLUMN queue.history_policy.rotate_every IS 'How often queue.maintain() runs rotate_partitions(); shorter than partition_interval * premake.';
COMMENT ON COLUMN queue.history_policy.last_rotated IS 'The "now" of the last rotate_partitions() run (NULL: never). maintain() rotates when it is older than rotate_every, or in the future (clock moved back, or a test injected a later now).';
COMMENT ON COLUMN queue.history_policy.updated IS 'When configure_history() last changed the policy.';
