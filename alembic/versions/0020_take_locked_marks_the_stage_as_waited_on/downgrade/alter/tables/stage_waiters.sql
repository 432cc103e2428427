-- 0020 down: the comments of 0019.
COMMENT ON TABLE queue.stage_waiters IS 'Stages with a worker waiting for work (written by take_next when it finds nothing due): enqueue sends NOTIFY skiplock.<stage> only while until is in the future, so busy stages enqueue without the commit-serialising NOTIFY. Unlogged; empty after a crash until workers poll again.';
COMMENT ON COLUMN queue.stage_waiters.until IS 'Wake-ups are sent until then: one minute after a take_next found the stage empty (refreshed when less than 30 s are left).';
