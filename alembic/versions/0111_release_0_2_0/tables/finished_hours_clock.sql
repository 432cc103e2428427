-- How far queue.finished_hours is rolled up: one row. Every run that finished before rolled_to is
-- in finished_hours (as committed when its minute was rolled up); queue.hourly counts the runs
-- from rolled_to on from queue.history. maintain() moves it forward to the last whole minute that
-- ended at least 5 minutes ago (room for finishes that commit late).
CREATE TABLE queue.finished_hours_clock (
    rolled_to timestamptz
);
CREATE UNIQUE INDEX finished_hours_clock_one_row ON queue.finished_hours_clock ((true));
INSERT INTO queue.finished_hours_clock (rolled_to) VALUES (NULL);

COMMENT ON TABLE queue.finished_hours_clock IS 'One row: the minute up to which queue.finished_hours holds the finished runs; queue.hourly counts the later ones from history.';
COMMENT ON COLUMN queue.finished_hours_clock.rolled_to IS 'The runs that finished before it are rolled up (a whole minute); NULL: none yet.';
