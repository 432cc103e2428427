-- The parsed form of a cron expression: what queue._cron_parse returns and queue._cron_next reads.
-- Each array holds the values a field allows, sorted, without duplicates.
CREATE TYPE queue.cron_fields AS (
    minute   integer[],
    hour     integer[],
    dom      integer[],
    month    integer[],
    dow      integer[],
    dom_star boolean,
    dow_star boolean
);
COMMENT ON TYPE queue.cron_fields IS 'A parsed cron expression (queue._cron_parse): the allowed values of each of the five fields, and whether day of month and day of week were written starting with * (Vixie cron''s rule: when neither was, a day matches if either matches).';
COMMENT ON COLUMN queue.cron_fields.minute IS 'Minutes allowed, 0-59, ascending.';
COMMENT ON COLUMN queue.cron_fields.hour IS 'Hours allowed, 0-23, ascending.';
COMMENT ON COLUMN queue.cron_fields.dom IS 'Days of the month allowed, 1-31, ascending.';
COMMENT ON COLUMN queue.cron_fields.month IS 'Months allowed, 1-12, ascending.';
COMMENT ON COLUMN queue.cron_fields.dow IS 'Days of the week allowed, 0-6 with 0 = Sunday (a 7 in the expression is stored as 0), ascending.';
COMMENT ON COLUMN queue.cron_fields.dom_star IS 'The day-of-month field began with * (*, */n): it does not restrict on its own, so the day must match both fields.';
COMMENT ON COLUMN queue.cron_fields.dow_star IS 'The day-of-week field began with * (*, */n): it does not restrict on its own, so the day must match both fields.';
