-- Finished runs per stage, UTC hour and final status, rolled up from queue.history by maintain()
-- (queue._roll_up_hours) a minute at a time, 5 minutes after the minute ended, so that
-- queue.hourly reads a few rows an hour instead of every run: only what finished after
-- queue.finished_hours_clock is counted from history. Never written by a finish. Kept small: the
-- rows of hours over 8 days old are deleted as the hour turns (at most stages x 3 rows an hour):
-- the 7 days queue.hourly shows and one to spare.
CREATE TABLE queue.finished_hours (
    stage     text              NOT NULL,
    hour      timestamptz       NOT NULL,
    status    queue.task_status NOT NULL,
    runs      bigint            NOT NULL,
    timed     bigint            NOT NULL,  -- of them, runs with a start (cancelled before a take have none)
    run_time  interval          NOT NULL,  -- sum of finished - started of those; 0 when none
    -- hour first: the chart reads the last hours, and the old ones are deleted by hour.
    CONSTRAINT finished_hours_pkey PRIMARY KEY (hour, stage, status)
);

COMMENT ON TABLE queue.finished_hours IS 'Finished runs per stage, UTC hour and final status, rolled up by maintain() from queue.history 5 minutes after each minute; the last 8 days. Read through queue.hourly.';
COMMENT ON COLUMN queue.finished_hours.stage IS 'Stage.';
COMMENT ON COLUMN queue.finished_hours.hour IS 'Start of the UTC hour the runs finished in.';
COMMENT ON COLUMN queue.finished_hours.status IS 'done, fatal or cancelled.';
COMMENT ON COLUMN queue.finished_hours.runs IS 'Runs that finished in the hour with this status, as committed when each minute was rolled up.';
COMMENT ON COLUMN queue.finished_hours.timed IS 'Of them, runs with a start time (taken at least once).';
COMMENT ON COLUMN queue.finished_hours.run_time IS 'Sum of finished - started of the timed runs; 0 when none.';
