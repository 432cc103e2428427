-- How far queue.finished_hours is rolled up: one row. Every hour before rolled_to is in
-- finished_hours (as committed when it was rolled); queue.hourly counts the hours from rolled_to
-- on from queue.history. maintain() moves it forward to the last hour that closed at least
-- queue._roll_up_hours' margin ago (room for finishes that commit late).
CREATE TABLE queue.finished_hours_clock (
    rolled_to timestamptz
);
CREATE UNIQUE INDEX finished_hours_clock_one_row ON queue.finished_hours_clock ((true));
INSERT INTO queue.finished_hours_clock (rolled_to) VALUES (NULL);

COMMENT ON TABLE queue.finished_hours_clock IS 'One row: the UTC hour up to which queue.finished_hours holds every finished run; queue.hourly counts the later ones from history.';
COMMENT ON COLUMN queue.finished_hours_clock.rolled_to IS 'The hours before it are rolled up (an hour boundary, UTC); NULL: none yet.';
