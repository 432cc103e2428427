-- Which stages have a worker waiting for work. take_next, take_locked and run_sql_tasks write a
-- row when they find nothing due (see _mark_waiting); enqueue, enqueue_batch, finish(next_stage)
-- and whatever else makes a task due at once (see _wake_waiters) send their NOTIFY only while
-- the row is fresh. NOTIFY makes committing transactions queue on one database-wide lock, so a
-- busy stage, whose workers never find it empty, enqueues without it. Unlogged: after a crash
-- the rows are gone until workers next find their stages empty, which they do on their next poll.
CREATE UNLOGGED TABLE queue.stage_waiters (
    stage  text        NOT NULL CONSTRAINT stage_waiters_pkey PRIMARY KEY,
    until  timestamptz NOT NULL
);

COMMENT ON TABLE queue.stage_waiters IS 'Stages with a worker waiting for work, marked by takes that found nothing due: enqueues and other wake-ups send NOTIFY skiplock.<stage> only while a fresh row is here. Unlogged: a lost row is rewritten at the next empty poll.';
COMMENT ON COLUMN queue.stage_waiters.stage IS 'The stage a worker found empty.';
COMMENT ON COLUMN queue.stage_waiters.until IS 'Wake-ups are sent until then: one minute after a take found the stage empty (refreshed when less than 30 s are left).';
