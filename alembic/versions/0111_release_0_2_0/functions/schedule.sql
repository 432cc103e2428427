-- schedule(name, cron, stage, payload, priority, timezone, overlap): create or replace a named cron
-- schedule; returns its next fire time. Each due tick enqueues one task (payload, stage, priority)
-- when queue.fire_schedules() runs (queue.maintain() calls it).
--   cron      5 fields (minute hour day-of-month month day-of-week) or a macro, see _cron_parse.
--   timezone  the cron fields are wall-clock time there (default UTC), see _cron_next.
--   overlap   true (default) fires every tick; false skips a tick while the task the schedule last
--             enqueued is still live (ready, running or waiting for a retry, in any stage).
-- Replacing keeps the pending tick when cron and timezone are unchanged, so re-running a deploy
-- script never loses or repeats a tick; a new cron or timezone starts from the first tick after now
-- (or after the last fired tick, if later: a tick never fires twice).
-- Raises 22004 for a NULL argument, 22023 for an invalid name, cron expression (or one that never
-- fires), stage, payload or time zone, 54000 for a payload over 1 MiB.
-- Writes queue.schedules (one row, locked until commit).
CREATE OR REPLACE FUNCTION queue.schedule(
        name     text,
        cron     text,
        stage    text    DEFAULT 'default',
        payload  jsonb   DEFAULT '{}',
        priority integer DEFAULT 0,
        timezone text    DEFAULT 'UTC',
        overlap  boolean DEFAULT true)
    RETURNS timestamptz
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now  timestamptz := pg_catalog.now();
    v_old  queue.schedules;
    v_next timestamptz;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN schedule.name IS NULL OR schedule.name = '' OR pg_catalog.length(schedule.name) > 200 THEN 'name'
                  WHEN pg_catalog.length(schedule.cron) > 1000 THEN 'cron'
                  WHEN schedule.stage IS NULL OR schedule.stage IN ('', '*') OR pg_catalog.octet_length(schedule.stage) > 54 THEN 'stage'
                  WHEN schedule.payload IS NULL OR pg_catalog.jsonb_typeof(schedule.payload) NOT IN ('object', 'array')
                       OR pg_catalog.pg_column_size(schedule.payload) > 1048576 THEN 'payload'
                  WHEN schedule.priority IS NULL THEN 'priority'
                  WHEN schedule.overlap IS NULL THEN 'overlap'
                  WHEN schedule.timezone IS NOT NULL
                       AND (schedule.timezone = '' OR pg_catalog.length(schedule.timezone) > 100
                            OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names z
                                            WHERE pg_catalog.lower(z.name) = pg_catalog.lower(schedule.timezone))) THEN 'timezone'
                  -- last: measured uncompressed there, it may turn out to fit
                  WHEN pg_catalog.pg_column_compression(schedule.payload) IS NOT NULL THEN 'payload' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('schedule', v_bad, pg_catalog.jsonb_build_object(
            'name', schedule.name, 'cron', schedule.cron, 'stage', schedule.stage,
            'payload', schedule.payload::text, 'priority', schedule.priority::text,
            'overlap', schedule.overlap::text, 'timezone', schedule.timezone));
    END IF;
    -- </arguments>

    SELECT s.* INTO v_old
      FROM queue.schedules s
     WHERE s.name = schedule.name
       FOR UPDATE;
    IF FOUND AND v_old.cron = schedule.cron AND v_old.timezone = schedule.timezone THEN
        v_next := v_old.next_fire;
    ELSE
        -- Validates the expression and the time zone (22004/22023), and that it ever fires.
        v_next := queue._cron_next(schedule.cron, GREATEST(v_now, v_old.last_fired), schedule.timezone);
    END IF;

    INSERT INTO queue.schedules AS s (name, cron, stage, payload, priority, timezone, next_fire, created, updated,
                                      overlap)
    VALUES (schedule.name, schedule.cron, schedule.stage, schedule.payload, schedule.priority,
            schedule.timezone, v_next, v_now, v_now, schedule.overlap)
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
       SET cron = excluded.cron, stage = excluded.stage, payload = excluded.payload,
           priority = excluded.priority, timezone = excluded.timezone,
           next_fire = excluded.next_fire, updated = excluded.updated, overlap = excluded.overlap;
    RETURN v_next;
END
$$;
COMMENT ON FUNCTION queue.schedule(text, text, text, jsonb, integer, text, boolean) IS 'Creates or replaces a named cron schedule (5-field cron or @daily etc., in timezone): each due tick enqueues one task (overlap false: none while the last is live). Returns the next fire time. Same cron and timezone keep the pending tick.';
REVOKE ALL ON FUNCTION queue.schedule(text, text, text, jsonb, integer, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.schedule(text, text, text, jsonb, integer, text, boolean) TO skiplock_admin;
