-- schedule(…, overlap): skip a tick while the last task is live; last_task is that task (also run_schedule_now's).
-- A constant default and a nullable column: no rewrite.
-- One DO block: on Citus an ALTER TABLE sends its whole query string to the nodes, which
-- refuse several commands in one (each statement of a block is a query string of its own).
DO $$
BEGIN
    ALTER TABLE queue.schedules ADD COLUMN IF NOT EXISTS overlap boolean NOT NULL DEFAULT true;
    ALTER TABLE queue.schedules ADD COLUMN IF NOT EXISTS last_task bigint;
    COMMENT ON TABLE queue.schedules IS 'Named cron schedules: each due tick enqueues one task (queue.fire_schedules, run by queue.maintain). Change with queue.schedule() and queue.unschedule() (role skiplock_admin); readable by skiplock_admin and skiplock_monitor.';
    COMMENT ON COLUMN queue.schedules.overlap IS 'true (default): every tick enqueues a task. false: a tick is skipped (next_fire moves on, nothing enqueued) while last_task is still live.';
    COMMENT ON COLUMN queue.schedules.last_task IS 'Id of the task the schedule last enqueued (a tick or run_schedule_now); NULL: none yet.';
END
$$;
