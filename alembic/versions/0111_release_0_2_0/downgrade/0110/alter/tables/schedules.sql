-- One DO block: on Citus an ALTER TABLE sends its whole query string to the nodes, which
-- refuse several commands in one (each statement of a block is a query string of its own).
DO $$
BEGIN
    ALTER TABLE queue.schedules DROP COLUMN IF EXISTS overlap;
    ALTER TABLE queue.schedules DROP COLUMN IF EXISTS last_task;
    COMMENT ON TABLE queue.schedules IS 'Named cron schedules: each due tick enqueues one task (queue.fire_schedules, run by queue.maintain). Change with queue.schedule() and queue.unschedule() (role skiplock_admin); readable by skiplock_admin and skiplock_monitor.';
END
$$;
