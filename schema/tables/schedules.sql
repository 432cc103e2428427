-- Named cron schedules: queue.fire_schedules() (called by queue.maintain()) enqueues one task for
-- each schedule whose next_fire has come, and moves next_fire on. Written only through
-- queue.schedule(), queue.unschedule(), queue.fire_schedules() and queue.run_schedule_now().
CREATE TABLE queue.schedules (
    name        text        NOT NULL PRIMARY KEY
                            CONSTRAINT schedules_name_length CHECK (length(name) BETWEEN 1 AND 200),
    cron        text        NOT NULL
                            CONSTRAINT schedules_cron_length CHECK (length(cron) BETWEEN 1 AND 1000),
    stage       text        NOT NULL DEFAULT 'default'
                            CONSTRAINT schedules_stage_named CHECK (stage <> '*' AND octet_length(stage) BETWEEN 1 AND 54),
    payload     jsonb       NOT NULL DEFAULT '{}'
                            CONSTRAINT schedules_payload_container CHECK (jsonb_typeof(payload) IN ('object', 'array')),
    priority    integer     NOT NULL DEFAULT 0,
    timezone    text        NOT NULL DEFAULT 'UTC'
                            CONSTRAINT schedules_timezone_named CHECK (timezone <> ''),
    next_fire   timestamptz NOT NULL,
    last_fired  timestamptz,
    created     timestamptz NOT NULL DEFAULT now(),
    updated     timestamptz NOT NULL DEFAULT now(),
    overlap     boolean     NOT NULL DEFAULT true,
    last_task   bigint,
    CONSTRAINT schedules_fired_before_next CHECK (last_fired IS NULL OR last_fired < next_fire)
);

-- fire_schedules() looks for next_fire <= now on every call (every few seconds).
CREATE INDEX schedules_next_fire ON queue.schedules (next_fire);

COMMENT ON TABLE queue.schedules IS 'Named cron schedules: each due tick enqueues one task (queue.fire_schedules, run by queue.maintain). Change with queue.schedule() and queue.unschedule() (role skiplock_admin); readable by skiplock_admin and skiplock_monitor.';
COMMENT ON COLUMN queue.schedules.name IS 'The schedule''s name, 1 to 200 characters; schedule() with an existing name replaces it.';
COMMENT ON COLUMN queue.schedules.cron IS 'Cron expression as given: minute hour day-of-month month day-of-week (*, a-b, */n, lists, jan-dec, sun-sat) or @hourly, @daily, @weekly, @monthly, @yearly.';
COMMENT ON COLUMN queue.schedules.stage IS 'Stage each fired task is enqueued into.';
COMMENT ON COLUMN queue.schedules.payload IS 'Payload of each fired task (a JSON object or array).';
COMMENT ON COLUMN queue.schedules.priority IS 'Priority of each fired task (lower runs first).';
COMMENT ON COLUMN queue.schedules.timezone IS 'Time zone the cron fields are read in (wall-clock time there); default UTC.';
COMMENT ON COLUMN queue.schedules.next_fire IS 'The next due tick: fire_schedules(now) fires the schedule once when next_fire <= now, then sets it to the first tick after now (missed ticks are skipped, not caught up).';
COMMENT ON COLUMN queue.schedules.last_fired IS 'The tick the schedule last fired for (the latest one that was due); NULL: never fired.';
COMMENT ON COLUMN queue.schedules.created IS 'When the schedule was first created.';
COMMENT ON COLUMN queue.schedules.updated IS 'When schedule() last created or replaced it (firing does not change it).';
COMMENT ON COLUMN queue.schedules.overlap IS 'true (default): every tick enqueues a task. false: a tick is skipped (next_fire moves on, nothing enqueued) while last_task is still live.';
COMMENT ON COLUMN queue.schedules.last_task IS 'Id of the task the schedule last enqueued (a tick or run_schedule_now); NULL: none yet.';

GRANT SELECT ON queue.schedules TO skiplock_admin, skiplock_monitor;
