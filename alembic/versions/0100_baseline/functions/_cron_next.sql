-- _cron_next(expr, after, timezone): the first tick of a cron expression strictly after `after`.
--   The fields are wall-clock time in `timezone`, a zone name: TimeZone is set to it for the call
--   (so CET keeps its summer time), and the caller's own setting is untouched.
--   Around a DST change a skipped time fires as if the jump had not happened yet (02:30 on the
--   spring-forward night fires at 03:30, once); a repeated time fires once, at its second
--   occurrence, so a schedule more often than hourly pauses for the repeated hour.
--   The search jumps to the next allowed month, day, hour and minute, and gives up after 50 years
--   (an expression that fires at all fires within 40).
-- Raises 22004 for a NULL argument; 22023 for an invalid expression, an unknown time zone, an
-- infinite `after`, or an expression that never fires (0 0 30 2 *). Reads and writes nothing.
CREATE OR REPLACE FUNCTION queue._cron_next(expr text, after timestamptz, timezone text DEFAULT 'UTC')
    RETURNS timestamptz
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
    SET TimeZone = 'UTC'
AS $$
DECLARE
    c_horizon CONSTANT integer := 50;  -- years
    v_f        queue.cron_fields;
    v_local    timestamp;
    v_wall     timestamp;
    v_limit    timestamp;
    v_at       timestamptz;
    v_best     timestamptz;
    v_year     integer;
    v_month    integer;
    v_day      integer;
    v_hour     integer;
    v_minute   integer;
    v_last     integer;
    v_days     integer;
    v_dow      integer;
    v_x        integer;
    v_next     integer;
BEGIN
    IF _cron_next.after IS NULL OR _cron_next.timezone IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', CASE WHEN _cron_next.after IS NULL THEN 'after' ELSE 'timezone' END
            USING ERRCODE = '22004',
                  DETAIL = CASE WHEN _cron_next.after IS NULL AND _cron_next.timezone IS NULL THEN 'after and timezone are NULL.'
                                WHEN _cron_next.after IS NULL THEN 'after is NULL.'
                                ELSE 'timezone is NULL.' END,
                  HINT = 'Give a time to search from and a time zone such as ''UTC''.';
    END IF;
    IF NOT pg_catalog.isfinite(_cron_next.after) THEN
        RAISE EXCEPTION 'after must be finite'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('after is %s.', _cron_next.after),
                  HINT = 'Search from a real point in time, e.g. now().';
    END IF;
    v_f := queue._cron_parse(_cron_next.expr);

    -- A date no allowed month has never comes (the arrays are sorted: dom[1] is the smallest day).
    v_next := NULL;
    IF NOT v_f.dom_star AND v_f.dow_star THEN
        FOREACH v_x IN ARRAY v_f.month LOOP
            IF v_f.dom[1] <= (CASE WHEN v_x = 2 THEN 29 ELSE 31 - (v_x - 1) % 7 % 2 END) THEN
                v_next := v_x;
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF NOT v_f.dom_star AND v_f.dow_star AND v_next IS NULL THEN
        RAISE EXCEPTION 'cron expression never fires'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('No month allowed by %s has any of its days of the month.',
                                             pg_catalog.quote_literal(_cron_next.expr)),
                  HINT = 'Check the day-of-month and month fields, e.g. 30 2 (30 February) never comes.';
    END IF;

    -- From here on timestamptz::timestamp and timestamp::timestamptz convert in the zone. A local
    -- setting (true) in a function with a SET TimeZone clause of its own ends with the call.
    BEGIN
        PERFORM pg_catalog.set_config('TimeZone', _cron_next.timezone, true);
    EXCEPTION WHEN invalid_parameter_value THEN
        RAISE EXCEPTION 'unknown time zone'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('timezone is %s.', pg_catalog.quote_literal(_cron_next.timezone)),
                  HINT = 'Use a name from pg_timezone_names, such as ''UTC'' or ''Europe/Berlin''.';
    END;
    -- Start at the wall-clock time of `after` under the smallest UTC offset in force within a day
    -- of it: near a DST change a wall-clock time earlier than `after`'s own can be a later instant.
    v_local := LEAST(_cron_next.after::timestamp,
                     (_cron_next.after - interval '24 hours')::timestamp + interval '24 hours',
                     (_cron_next.after + interval '24 hours')::timestamp - interval '24 hours');
    v_wall   := pg_catalog.date_trunc('minute', v_local) + interval '1 minute';
    v_year   := pg_catalog.date_part('year', v_wall)::integer;
    v_month  := pg_catalog.date_part('month', v_wall)::integer;
    v_day    := pg_catalog.date_part('day', v_wall)::integer;
    v_hour   := pg_catalog.date_part('hour', v_wall)::integer;
    v_minute := pg_catalog.date_part('minute', v_wall)::integer;
    v_last   := v_year + c_horizon;

    LOOP
        IF v_year > v_last THEN
            EXIT WHEN v_best IS NOT NULL;
            RAISE EXCEPTION 'cron expression never fires'
                USING ERRCODE = '22023',
                      DETAIL = pg_catalog.format('%s has no tick in the %s years after %s.',
                                                 pg_catalog.quote_literal(_cron_next.expr), c_horizon, _cron_next.after),
                      HINT = 'Check the day-of-month, month and day-of-week fields.';
        END IF;

        IF NOT v_month = ANY (v_f.month) THEN
            v_next := NULL;
            FOREACH v_x IN ARRAY v_f.month LOOP
                IF v_x > v_month THEN
                    v_next := v_x;
                    EXIT;
                END IF;
            END LOOP;
            IF v_next IS NULL THEN
                v_year := v_year + 1;
                v_month := v_f.month[1];
            ELSE
                v_month := v_next;
            END IF;
            v_day := 1; v_hour := 0; v_minute := 0;
            CONTINUE;
        END IF;

        v_days := CASE WHEN v_month <> 2 THEN 31 - (v_month - 1) % 7 % 2
                       WHEN (v_year % 4 = 0 AND v_year % 100 <> 0) OR v_year % 400 = 0 THEN 29
                       ELSE 28 END;
        IF v_day > v_days THEN
            v_month := v_month + 1;
            IF v_month > 12 THEN
                v_month := 1;
                v_year := v_year + 1;
            END IF;
            v_day := 1; v_hour := 0; v_minute := 0;
            CONTINUE;
        END IF;

        v_dow := pg_catalog.date_part('dow', pg_catalog.make_date(v_year, v_month, v_day))::integer;
        IF NOT (CASE WHEN v_f.dom_star OR v_f.dow_star
                     THEN v_day = ANY (v_f.dom) AND v_dow = ANY (v_f.dow)
                     ELSE v_day = ANY (v_f.dom) OR v_dow = ANY (v_f.dow) END) THEN
            v_day := v_day + 1; v_hour := 0; v_minute := 0;
            CONTINUE;
        END IF;

        v_next := NULL;
        FOREACH v_x IN ARRAY v_f.hour LOOP
            IF v_x >= v_hour THEN
                v_next := v_x;
                EXIT;
            END IF;
        END LOOP;
        IF v_next IS NULL THEN
            v_day := v_day + 1; v_hour := 0; v_minute := 0;
            CONTINUE;
        END IF;
        IF v_next > v_hour THEN
            v_hour := v_next;
            v_minute := 0;
        END IF;

        v_next := NULL;
        FOREACH v_x IN ARRAY v_f.minute LOOP
            IF v_x >= v_minute THEN
                v_next := v_x;
                EXIT;
            END IF;
        END LOOP;
        IF v_next IS NULL THEN
            v_hour := v_hour + 1; v_minute := 0;
            CONTINUE;
        END IF;
        v_minute := v_next;

        -- A matching wall-clock time.
        v_wall := pg_catalog.make_timestamp(v_year, v_month, v_day, v_hour, v_minute, 0);
        EXIT WHEN v_wall >= v_limit;
        v_at := v_wall::timestamptz;
        IF v_at > _cron_next.after THEN
            IF v_best IS NULL OR v_at < v_best THEN
                v_best := v_at;
            END IF;
            IF v_limit IS NULL THEN
                -- A time the clocks skipped maps to an instant later than the wall-clock times just
                -- after the jump: look on through them before taking it.
                v_limit := v_wall + GREATEST(v_at::timestamp - v_wall, interval '0');
                EXIT WHEN v_limit = v_wall;
            END IF;
        END IF;
        v_minute := v_minute + 1;
    END LOOP;
    RETURN v_best;
END
$$;
COMMENT ON FUNCTION queue._cron_next(text, timestamptz, text) IS 'Internal: the first tick of a cron expression strictly after `after`, its fields read as wall-clock time in the zone `timezone` (a time DST skips fires as if before the jump). Raises 22004, or 22023 for a bad expression or zone or one never firing.';
REVOKE ALL ON FUNCTION queue._cron_next(text, timestamptz, text) FROM PUBLIC;
