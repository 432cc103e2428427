-- _cron_parse(expr): a standard 5-field cron expression as the values each field allows.
--   Fields, separated by blanks: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12 or
--   jan-dec) day-of-week (0-7 or sun-sat; 0 and 7 are Sunday). Names are case-insensitive.
--   Each field is a comma-separated list of: *, a value a, a range a-b, a step */n, a-b/n or a/n
--   (a/n: from a to the field's maximum, every n). Macros: @yearly (@annually), @monthly,
--   @weekly, @daily (@midnight), @hourly.
--   A day-of-month or day-of-week field that begins with * does not restrict on its own
--   (dom_star, dow_star); when neither does, a day matches if either matches (Vixie cron).
-- Raises 22004 for NULL, 22023 for anything else it cannot read, with a DETAIL naming the field.
-- Reads and writes nothing.
CREATE OR REPLACE FUNCTION queue._cron_parse(expr text)
    RETURNS queue.cron_fields
    LANGUAGE plpgsql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_field  CONSTANT text[]    := ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'];
    c_low    CONSTANT integer[] := ARRAY[0, 0, 1, 1, 0];
    c_high   CONSTANT integer[] := ARRAY[59, 23, 31, 12, 7];
    c_months CONSTANT text[]    := ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun',
                                         'jul', 'aug', 'sep', 'oct', 'nov', 'dec'];
    c_days   CONSTANT text[]    := ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'];
    v_text   text;
    v_fields text[];
    v_hint   text;
    v_item   text;
    v_parts  text[];
    v_bound  integer[];
    v_step   integer;
    v_mask   bigint;
    v_values integer[];
    v_result queue.cron_fields;
BEGIN
    IF _cron_parse.expr IS NULL THEN
        RAISE EXCEPTION 'cron expression must not be NULL'
            USING ERRCODE = '22004', DETAIL = 'The cron expression is NULL.',
                  HINT = 'Give five fields (minute hour day-of-month month day-of-week), e.g. ''*/5 * * * *''.';
    END IF;
    -- Not lower-cased: the errors quote the fields as written; names are compared in lower case.
    v_text := pg_catalog.btrim(_cron_parse.expr, E' \t\r\n');
    v_text := CASE pg_catalog.lower(v_text)
                  WHEN '@yearly'   THEN '0 0 1 1 *'
                  WHEN '@annually' THEN '0 0 1 1 *'
                  WHEN '@monthly'  THEN '0 0 1 * *'
                  WHEN '@weekly'   THEN '0 0 * * 0'
                  WHEN '@daily'    THEN '0 0 * * *'
                  WHEN '@midnight' THEN '0 0 * * *'
                  WHEN '@hourly'   THEN '0 * * * *'
                  ELSE v_text
              END;
    IF pg_catalog.left(v_text, 1) = '@' THEN
        RAISE EXCEPTION 'invalid cron expression'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s is not a known macro.', pg_catalog.quote_literal(_cron_parse.expr)),
                  HINT = 'The macros are @yearly (@annually), @monthly, @weekly, @daily (@midnight) and @hourly; @reboot has no meaning for a queue.';
    END IF;
    v_fields := CASE WHEN v_text = '' THEN '{}'::text[]
                     ELSE pg_catalog.regexp_split_to_array(v_text, '[ \t\r\n]+') END;
    IF pg_catalog.cardinality(v_fields) <> 5 THEN
        RAISE EXCEPTION 'invalid cron expression'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s has %s fields, not 5.', pg_catalog.quote_literal(_cron_parse.expr),
                                             pg_catalog.cardinality(v_fields)),
                  HINT = 'Give five fields separated by blanks: minute hour day-of-month month day-of-week, e.g. ''*/5 * * * *'', or a macro such as @daily. There is no seconds or year field.';
    END IF;

    FOR i IN 1 .. 5 LOOP
        v_hint := pg_catalog.format('The %s field takes %s-%s%s. Write *, a value, a range a-b, a step */n, a-b/n or a/n, or a list of these separated by commas.',
                                    c_field[i], c_low[i], c_high[i],
                                    CASE i WHEN 4 THEN ' or jan-dec'
                                           WHEN 5 THEN ' (0 and 7 are Sunday) or sun-sat'
                                           ELSE '' END);
        v_mask := 0;  -- bit v set: value v allowed
        FOREACH v_item IN ARRAY pg_catalog.string_to_array(v_fields[i], ',') LOOP
            -- {star, first, last, step}
            v_parts := pg_catalog.regexp_match(v_item, '^(?:(\*)|([A-Za-z0-9]+)(?:-([A-Za-z0-9]+))?)(?:/([0-9]+))?$');
            IF v_parts IS NULL THEN
                RAISE EXCEPTION 'invalid cron expression'
                    USING ERRCODE = '22023',
                          DETAIL = pg_catalog.format('Field %s (%s) is %s: %s cannot be read.', i, c_field[i],
                                                     pg_catalog.quote_literal(v_fields[i]),
                                                     pg_catalog.quote_literal(v_item)),
                          HINT = v_hint;
            END IF;

            -- The bounds: a number, or a name in the month and day-of-week fields.
            v_bound := ARRAY[c_low[i], CASE WHEN i = 5 THEN 6 ELSE c_high[i] END];
            FOR j IN 2 .. 3 LOOP
                CONTINUE WHEN v_parts[j] IS NULL;
                IF v_parts[j] ~ '^[0-9]+$' THEN
                    -- 999 stands for any longer number: out of range below, never an overflow
                    v_bound[j - 1] := CASE WHEN pg_catalog.length(v_parts[j]) <= 3 THEN v_parts[j]::integer ELSE 999 END;
                ELSIF i = 4 AND pg_catalog.lower(v_parts[j]) = ANY (c_months) THEN
                    v_bound[j - 1] := pg_catalog.array_position(c_months, pg_catalog.lower(v_parts[j]));
                ELSIF i = 5 AND pg_catalog.lower(v_parts[j]) = ANY (c_days) THEN
                    v_bound[j - 1] := pg_catalog.array_position(c_days, pg_catalog.lower(v_parts[j])) - 1;
                ELSE
                    RAISE EXCEPTION 'invalid cron expression'
                        USING ERRCODE = '22023',
                              DETAIL = pg_catalog.format('Field %s (%s) is %s: %s is not a value of this field.', i,
                                                         c_field[i], pg_catalog.quote_literal(v_fields[i]),
                                                         pg_catalog.quote_literal(v_parts[j])),
                              HINT = v_hint;
                END IF;
                IF v_bound[j - 1] < c_low[i] OR v_bound[j - 1] > c_high[i] THEN
                    RAISE EXCEPTION 'invalid cron expression'
                        USING ERRCODE = '22023',
                              DETAIL = pg_catalog.format('Field %s (%s) is %s: %s is outside %s-%s.', i, c_field[i],
                                                         pg_catalog.quote_literal(v_fields[i]), v_parts[j],
                                                         c_low[i], c_high[i]),
                              HINT = v_hint;
                END IF;
            END LOOP;
            IF v_parts[2] IS NOT NULL AND v_parts[3] IS NULL THEN
                -- a single value a, or a/n: from a to the end of the field
                v_bound[2] := CASE WHEN v_parts[4] IS NULL THEN v_bound[1] ELSE c_high[i] END;
            ELSIF v_bound[1] > v_bound[2] THEN
                RAISE EXCEPTION 'invalid cron expression'
                    USING ERRCODE = '22023',
                          DETAIL = pg_catalog.format('Field %s (%s) is %s: the range %s runs backwards.', i, c_field[i],
                                                     pg_catalog.quote_literal(v_fields[i]),
                                                     pg_catalog.quote_literal(v_item)),
                          HINT = 'Write a range low-high, e.g. 1-5; a range cannot wrap around the end of the field. ' || v_hint;
            END IF;

            v_step := CASE WHEN v_parts[4] IS NULL THEN 1
                           WHEN pg_catalog.length(v_parts[4]) <= 3 THEN v_parts[4]::integer
                           ELSE 999 END;
            IF v_step < 1 OR v_step > c_high[i] THEN
                RAISE EXCEPTION 'invalid cron expression'
                    USING ERRCODE = '22023',
                          DETAIL = pg_catalog.format('Field %s (%s) is %s: the step %s is outside 1-%s.', i,
                                                     c_field[i], pg_catalog.quote_literal(v_fields[i]),
                                                     v_parts[4], c_high[i]),
                          HINT = v_hint;
            END IF;

            -- Loops over simple expressions, no query: a query here would cost more than all the rest.
            FOR v IN v_bound[1] .. v_bound[2] BY v_step LOOP
                v_mask := v_mask | (1::bigint << (CASE WHEN i = 5 THEN v % 7 ELSE v END));
            END LOOP;
        END LOOP;

        v_values := '{}';
        FOR v IN c_low[i] .. c_high[i] LOOP
            IF v_mask & (1::bigint << v) <> 0 THEN
                v_values := v_values || v;
            END IF;
        END LOOP;
        CASE i
            WHEN 1 THEN v_result.minute := v_values;
            WHEN 2 THEN v_result.hour := v_values;
            WHEN 3 THEN v_result.dom := v_values;
            WHEN 4 THEN v_result.month := v_values;
            ELSE v_result.dow := v_values;
        END CASE;
    END LOOP;
    v_result.dom_star := pg_catalog.left(v_fields[3], 1) = '*';
    v_result.dow_star := pg_catalog.left(v_fields[5], 1) = '*';
    RETURN v_result;
END
$$;
COMMENT ON FUNCTION queue._cron_parse(text) IS 'Internal: parses a 5-field cron expression (minute hour day-of-month month day-of-week; *, a, a-b, */n, a-b/n, a/n, lists, names, 0 or 7 = Sunday) or a macro (@hourly to @yearly) into queue.cron_fields. Raises 22004 for NULL, 22023 for a bad field.';
REVOKE ALL ON FUNCTION queue._cron_parse(text) FROM PUBLIC;
