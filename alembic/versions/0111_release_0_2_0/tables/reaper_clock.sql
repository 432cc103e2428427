-- When reap_hung() last looked at the clock: one row. A later call that finds the clock moved
-- forward by more than the reaper's tolerance since then (a clock step, a suspended machine, an
-- outage of the server or of maintain()) does not take that time as time the workers had to
-- heartbeat in: leases that ran out within it get back the time they had left when it was
-- written (docs/reliability.md, "Clock jumps"). Written at most every 10 seconds.
CREATE TABLE queue.reaper_clock (
    observed timestamptz
);
CREATE UNIQUE INDEX reaper_clock_one_row ON queue.reaper_clock ((true));
INSERT INTO queue.reaper_clock (observed) VALUES (NULL);

COMMENT ON TABLE queue.reaper_clock IS 'One row: the now() at which reap_hung() last recorded the clock, so that a later call can tell a jump of the clock (or an outage) from time the workers had to heartbeat in.';
COMMENT ON COLUMN queue.reaper_clock.observed IS 'The transaction time of the reap_hung() call that last wrote it (NULL: never called).';
