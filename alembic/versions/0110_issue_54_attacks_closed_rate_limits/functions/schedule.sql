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
-- The six-argument form is dropped first, so that calls without overlap resolve to this one.
-- squawk-ignore ban-drop-function
DROP FUNCTION IF EXISTS queue.schedule(text, text, text, jsonb, integer, text);
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
BEGIN
    IF schedule.name IS NULL THEN
        RAISE EXCEPTION 'name must not be NULL'
            USING ERRCODE = '22004', DETAIL = 'schedule was called with name NULL.',
                  HINT = 'Name the schedule, e.g. ''nightly-report''.';
    END IF;
    IF schedule.name = '' OR pg_catalog.length(schedule.name) > 200 THEN
        RAISE EXCEPTION 'invalid schedule name'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The name has %s characters.', pg_catalog.length(schedule.name)),
                  HINT = 'A schedule name is 1 to 200 characters.';
    END IF;
    IF pg_catalog.length(schedule.cron) > 1000 THEN
        RAISE EXCEPTION 'invalid cron expression'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The expression has %s characters.', pg_catalog.length(schedule.cron)),
                  HINT = 'A cron expression is at most 1000 characters.';
    END IF;
    PERFORM queue._check_stage(schedule.stage);
    PERFORM queue._check_payload(schedule.payload);
    IF schedule.priority IS NULL THEN
        RAISE EXCEPTION 'priority must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('schedule was called with priority NULL for schedule %s.', pg_catalog.quote_literal(schedule.name)),
                  HINT = 'Lower runs first; the default is 0.';
    END IF;
    IF schedule.overlap IS NULL THEN
        RAISE EXCEPTION 'overlap must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('schedule was called with overlap NULL for schedule %s.', pg_catalog.quote_literal(schedule.name)),
                  HINT = 'true fires every tick (the default); false skips a tick while the previous task is live.';
    END IF;
    IF schedule.timezone = '' THEN
        RAISE EXCEPTION 'unknown time zone'
            USING ERRCODE = '22023',
                  DETAIL = 'timezone is empty.',
                  HINT = 'Use a name from pg_timezone_names, such as ''UTC'' or ''Europe/Berlin''.';
    END IF;
    -- Names only: PostgreSQL also takes POSIX strings, where '+02:00' means two hours WEST of
    -- Greenwich, the opposite of what a schedule's author means, and 'XYZ+1' is a zone of its own.
    -- No zone's name is longer than 100 characters: a longer text is refused before the scan
    -- (which would lower-case it once for each of the catalog's ~1,200 names).
    IF schedule.timezone IS NOT NULL AND (pg_catalog.length(schedule.timezone) > 100 OR NOT EXISTS (
           SELECT 1 FROM pg_catalog.pg_timezone_names z
            WHERE pg_catalog.lower(z.name) = pg_catalog.lower(schedule.timezone))) THEN
        RAISE EXCEPTION 'unknown time zone'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('timezone is %s, which is not the name of a time zone.',
                                             CASE WHEN pg_catalog.length(schedule.timezone) <= 80 THEN pg_catalog.quote_literal(schedule.timezone)
                                                  ELSE pg_catalog.format('%s... (%s characters)', pg_catalog.quote_literal(pg_catalog.left(schedule.timezone, 80)),
                                                                         pg_catalog.length(schedule.timezone)) END),
                  HINT = 'Use a name from pg_timezone_names, such as ''UTC'' or ''Europe/Berlin''; for a fixed offset, ''Etc/GMT-2'' is UTC+2 (POSIX signs are reversed).';
    END IF;

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
