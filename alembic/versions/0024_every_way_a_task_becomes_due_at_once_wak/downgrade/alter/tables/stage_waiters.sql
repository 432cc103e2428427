-- 0024 down: the comment of 0020.
COMMENT ON TABLE queue.stage_waiters IS 'Stages with a worker waiting for work (written by take_next, take_locked and run_sql_tasks when they find nothing due): enqueue sends NOTIFY skiplock.<stage> only while until is in the future, so busy stages enqueue without the commit-serialising NOTIFY. Unlogged; empty after a crash until workers poll again.';
