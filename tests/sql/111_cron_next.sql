-- queue._cron_next: the first tick strictly after a time, across minute, hour, day, month and year
-- boundaries, leap years, the day-of-month/day-of-week OR rule, time zones and DST changes; a
-- brute-force comparison; expressions that never fire and bad arguments raise.
-- Times are written with their offset, so the session's TimeZone does not matter.
BEGIN;
SELECT plan(70);

-- Minutes ----------------------------------------------------------------------------------------------------------
SELECT is(queue._cron_next('*/5 * * * *', '2026-01-01 12:03:10+00'), '2026-01-01 12:05:00+00', '*/5 from 12:03:10 is 12:05');
SELECT is(queue._cron_next('*/5 * * * *', '2026-01-01 12:05:00+00'), '2026-01-01 12:10:00+00', 'strictly after: from exactly 12:05 the next is 12:10');
SELECT is(queue._cron_next('*/5 * * * *', '2026-01-01 12:04:59.999999+00'), '2026-01-01 12:05:00+00', 'a microsecond before a tick gives that tick');
SELECT is(queue._cron_next('* * * * *', '2026-01-01 12:00:00.5+00'), '2026-01-01 12:01:00+00', '* * * * * is the next whole minute');
SELECT is(queue._cron_next('7,19 * * * *', '2026-01-01 12:08:00+00'), '2026-01-01 12:19:00+00', 'a list: the next listed minute in the hour');

-- Hours ------------------------------------------------------------------------------------------------------------
SELECT is(queue._cron_next('*/15 * * * *', '2026-01-01 12:50:00+00'), '2026-01-01 13:00:00+00', 'into the next hour');
SELECT is(queue._cron_next('0 * * * *', '2026-01-01 12:00:00+00'), '2026-01-01 13:00:00+00', 'hourly from the top of an hour: the next hour');
SELECT is(queue._cron_next('30 9-17 * * *', '2026-01-01 12:40:00+00'), '2026-01-01 13:30:00+00', 'within office hours: the next half past');
SELECT is(queue._cron_next('30 9-17 * * *', '2026-01-01 17:45:00+00'), '2026-01-02 09:30:00+00', 'after the last hour of the day: the first hour of the next day');
SELECT is(queue._cron_next('15 3 * * *', '2026-01-01 02:59:00+00'), '2026-01-01 03:15:00+00', 'a later hour of the same day');

-- Days -------------------------------------------------------------------------------------------------------------
SELECT is(queue._cron_next('0 0 * * *', '2026-01-01 23:59:59+00'), '2026-01-02 00:00:00+00', 'midnight: into the next day');
SELECT is(queue._cron_next('0 12 15 * *', '2026-01-15 12:00:00+00'), '2026-02-15 12:00:00+00', 'a day of the month just passed: next month');
SELECT is(queue._cron_next('0 0 * * 1', '2026-01-01 00:00:00+00'), '2026-01-05 00:00:00+00', 'Mondays: 1 January 2026 is a Thursday, so 5 January');
SELECT is(queue._cron_next('0 0 * * mon-fri', '2026-01-02 10:00:00+00'), '2026-01-05 00:00:00+00', 'weekdays: from Friday to Monday');

-- Months -----------------------------------------------------------------------------------------------------------
SELECT is(queue._cron_next('0 0 1 * *', '2026-01-15 00:00:00+00'), '2026-02-01 00:00:00+00', 'first of the month: the next month');
SELECT is(queue._cron_next('0 0 31 * *', '2026-01-31 00:00:00+00'), '2026-03-31 00:00:00+00', 'the 31st skips February');
SELECT is(queue._cron_next('0 0 31 * *', '2026-03-31 00:00:00+00'), '2026-05-31 00:00:00+00', 'the 31st skips April');
SELECT is(queue._cron_next('0 0 30 * *', '2026-01-30 00:00:00+00'), '2026-03-30 00:00:00+00', 'the 30th skips February');
SELECT is(queue._cron_next('0 0 1 jun,sep *', '2026-06-01 00:00:00+00'), '2026-09-01 00:00:00+00', 'listed months: the next one');

-- Years ------------------------------------------------------------------------------------------------------------
SELECT is(queue._cron_next('0 0 1 1 *', '2026-06-15 00:00:00+00'), '2027-01-01 00:00:00+00', 'new year: the next year');
SELECT is(queue._cron_next('59 23 31 12 *', '2026-12-31 23:59:00+00'), '2027-12-31 23:59:00+00', 'the last minute of the year, a year on');
SELECT is(queue._cron_next('* * * * *', '2026-12-31 23:59:30+00'), '2027-01-01 00:00:00+00', 'every minute: across the new year');
SELECT is(queue._cron_next('0 0 1 3 *', '2026-04-01 00:00:00+00'), '2027-03-01 00:00:00+00', 'a month already passed this year: next year');

-- Leap years -------------------------------------------------------------------------------------------------------
SELECT is(queue._cron_next('0 0 29 2 *', '2026-03-01 00:00:00+00'), '2028-02-29 00:00:00+00', '29 February: the next leap year (2028)');
SELECT is(queue._cron_next('0 0 29 2 *', '2028-02-29 00:00:00+00'), '2032-02-29 00:00:00+00', 'from one 29 February to the next, four years on');
SELECT is(queue._cron_next('0 0 29 2 *', '2096-03-01 00:00:00+00'), '2104-02-29 00:00:00+00', '2100 is no leap year: eight years from 2096 to 2104');
SELECT is(queue._cron_next('0 0 28 2 *', '2028-02-28 00:00:00+00'), '2029-02-28 00:00:00+00', '28 February comes every year');
SELECT is(queue._cron_next('0 0 1 3 *', '2028-02-28 12:00:00+00'), '2028-03-01 00:00:00+00', 'March follows 29 February in a leap year');
SELECT is(queue._cron_next('0 0 29 2 */7', '2072-03-01 00:00:00+00'), '2088-02-29 00:00:00+00',
          'a 29 February that is a Sunday, 16 years on: the search is not cut short at a few years');

-- Day of month and day of week -------------------------------------------------------------------------------------
SELECT is(queue._cron_next('0 0 13 * 5', '2026-01-01 00:00:00+00'), '2026-01-02 00:00:00+00',
          'both day fields restricted: either matches (Friday 2 January, by the day of week)');
SELECT is(queue._cron_next('0 0 13 * 5', '2026-01-10 00:00:00+00'), '2026-01-13 00:00:00+00',
          'both day fields restricted: either matches (Tuesday 13 January, by the day of month)');
SELECT is(queue._cron_next('0 0 13 * 5', '2026-01-13 00:00:00+00'), '2026-01-16 00:00:00+00',
          'both day fields restricted: the next Friday after the 13th');
SELECT is(queue._cron_next('0 0 */7 * 1', '2026-05-01 00:00:00+00'), '2026-06-01 00:00:00+00',
          'a day of month beginning with * does not restrict on its own: days 1, 8, 15, 22, 29 that are Mondays');
SELECT is(queue._cron_next('0 0 1 * *', '2026-05-01 00:00:00+00'), '2026-06-01 00:00:00+00', 'day of week * : only the day of month counts');
SELECT is(queue._cron_next('0 0 * * 7', '2026-01-01 00:00:00+00'), '2026-01-04 00:00:00+00', 'day of week 7 is Sunday (4 January 2026)');
SELECT is(queue._cron_next('@weekly', '2026-01-04 00:00:00+00'), '2026-01-11 00:00:00+00', '@weekly: Sunday midnight, a week on');

-- Time zones -------------------------------------------------------------------------------------------------------
SELECT is(queue._cron_next('0 0 * * *', '2026-01-01 12:00:00+00'), queue._cron_next('0 0 * * *', '2026-01-01 12:00:00+00', 'UTC'),
          'the default time zone is UTC');
SELECT is(queue._cron_next('0 9 * * *', '2026-01-01 12:00:00+00', 'Asia/Kolkata'), '2026-01-02 03:30:00+00',
          'fields are wall-clock time in the zone: 09:00 in Kolkata is 03:30 UTC');
SELECT is(queue._cron_next('0 12 * * *', '2026-01-10 00:00:00+00', 'America/New_York'), '2026-01-10 17:00:00+00',
          'noon in New York in winter is 17:00 UTC');
SELECT is(queue._cron_next('0 12 * * *', '2026-07-10 00:00:00+00', 'America/New_York'), '2026-07-10 16:00:00+00',
          'noon in New York in summer is 16:00 UTC');
SELECT is(queue._cron_next('0 0 1 1 *', '2026-12-31 22:30:00+00', 'Europe/Berlin'), '2026-12-31 23:00:00+00',
          'the new year in Berlin comes an hour before UTC''s');
SET LOCAL timezone = 'America/Los_Angeles';
SELECT is(queue._cron_next('0 0 * * *', '2026-01-01 12:00:00+00'), '2026-01-02 00:00:00+00',
          'the session''s TimeZone does not change the result');
RESET timezone;

-- Zone names that are also abbreviations are read as the zone, whatever timezone_abbreviations says.
SELECT is(queue._cron_next('0 12 * * *', '2026-07-01 00:00:00+00', 'CET'), '2026-07-01 10:00:00+00',
          'zone CET has summer time: noon on 1 July is 10:00 UTC (CEST), not 11:00 (the abbreviation CET, UTC+1)');
SELECT is(queue._cron_next('0 12 * * *', '2026-07-01 00:00:00+00', 'CET'), queue._cron_next('0 12 * * *', '2026-07-01 00:00:00+00', 'Europe/Paris'),
          'zone CET and Europe/Paris agree in summer');
SELECT is(queue._cron_next('0 12 * * *', '2026-07-01 00:00:00+00', 'EET'), '2026-07-01 09:00:00+00', 'zone EET in summer: noon is 09:00 UTC (EEST)');
SELECT is(queue._cron_next('0 12 * * *', '2026-07-01 00:00:00+00', 'WET'), '2026-07-01 11:00:00+00', 'zone WET in summer: noon is 11:00 UTC (WEST)');
SELECT is(queue._cron_next('0 12 * * *', '2026-07-01 00:00:00+00', 'MET'), '2026-07-01 10:00:00+00', 'zone MET in summer: noon is 10:00 UTC (MEST)');
SET LOCAL timezone_abbreviations = 'Australia';
SELECT is(queue._cron_next('0 12 * * *', '2026-07-01 00:00:00+00', 'EST'), '2026-07-01 17:00:00+00',
          'zone EST is UTC-5 even when the session''s timezone_abbreviations (Australia) read EST as UTC+10');
RESET timezone_abbreviations;

-- The zone is set for the call only: the caller's TimeZone is as it was, in and after the transaction.
SET LOCAL timezone = 'America/Los_Angeles';
SELECT is(current_setting('TimeZone') || ' ' || queue._cron_next('0 9 * * *', '2026-01-01 12:00:00+00', 'Asia/Kolkata')::text
          || ' ' || current_setting('TimeZone'),
          'America/Los_Angeles 2026-01-01 19:30:00-08 America/Los_Angeles',
          'the caller''s TimeZone (SET LOCAL) is the same before and after a call in another zone');
SELECT is(current_setting('TimeZone'), 'America/Los_Angeles', 'and after the statement');
RESET timezone;
SELECT is(current_setting('TimeZone'), (SELECT s.reset_val FROM pg_catalog.pg_settings s WHERE s.name = 'TimeZone'),
          'no call left a TimeZone behind: RESET gives the session''s own');
SELECT throws_ok($$SELECT queue._cron_next('0 0 * * *', '2026-01-01 00:00:00+00', 'Mars/Olympus_Mons')$$, '22023', 'unknown time zone',
                 'setup: an unknown zone raises');
SELECT is(current_setting('TimeZone'), (SELECT s.reset_val FROM pg_catalog.pg_settings s WHERE s.name = 'TimeZone'),
          'and leaves the caller''s TimeZone as it was');

-- DST in Europe/Berlin: clocks go from 02:00 CET to 03:00 CEST on Sunday 29 March 2026, back from
-- 03:00 CEST to 02:00 CET on Sunday 25 October 2026.
SELECT is(queue._cron_next('0 9 * * *', '2026-03-28 12:00:00+00', 'Europe/Berlin'), '2026-03-29 07:00:00+00',
          'DST: 09:00 in Berlin is 08:00 UTC before the change and 07:00 UTC on the day of it');
SELECT is(queue._cron_next('0 9 * * *', '2026-03-27 12:00:00+00', 'Europe/Berlin'), '2026-03-28 08:00:00+00',
          'DST: the day before the change 09:00 in Berlin is still 08:00 UTC');
SELECT is(queue._cron_next('30 2 * * *', '2026-03-28 12:00:00+00', 'Europe/Berlin'), '2026-03-29 01:30:00+00',
          'DST: 02:30, skipped by the clocks, fires at 03:30 CEST (01:30 UTC) instead of being lost');
SELECT is(queue._cron_next('30 2 * * *', '2026-03-29 01:30:00+00', 'Europe/Berlin'), '2026-03-30 00:30:00+00',
          'DST: after that, the next 02:30 is the next day''s (00:30 UTC, CEST)');
SELECT is(queue._cron_next('30 2,3 * * *', '2026-03-29 01:30:00+00', 'Europe/Berlin'), '2026-03-30 00:30:00+00',
          'DST: the skipped 02:30 and the real 03:30 are one instant, which fires once');
SELECT is(queue._cron_next('*/30 * * * *', '2026-03-29 00:30:00+00', 'Europe/Berlin'), '2026-03-29 01:00:00+00',
          'DST: every half hour runs on in real time across the jump (01:30 CET, then 03:00 CEST)');
SELECT is(queue._cron_next('30 2 * * *', '2026-10-25 00:00:00+00', 'Europe/Berlin'), '2026-10-25 01:30:00+00',
          'DST ends: 02:30, which happens twice, fires once, at the second time (CET, 01:30 UTC)');
SELECT is(queue._cron_next('30 2 * * *', '2026-10-25 01:30:00+00', 'Europe/Berlin'), '2026-10-26 01:30:00+00',
          'DST ends: and not again that day');

-- Brute force: every wall-clock minute of the next days that matches, mapped to its instant; the
-- earliest one after `after` is the answer. Zones with DST, half hours, a skipped day.
CREATE TEMP TABLE probes AS
SELECT e.expr, z.tz, z.center + pg_catalog.make_interval(mins => m.m) AS after
  FROM (VALUES ('*/7 * * * *'), ('30 2 * * *'), ('10,50 1-3 * * *'), ('0 */5 * * *'), ('45 23 * * 0,3'),
               ('5 4 13 * 5'), ('*/20 2 * * *')) AS e(expr)
 CROSS JOIN (VALUES ('Europe/Berlin', timestamptz '2026-03-29 01:00+00'), ('Europe/Berlin', '2026-10-25 01:00+00'),
                    ('America/New_York', '2026-11-01 06:00+00'), ('Australia/Lord_Howe', '2026-04-05 15:00+00'),
                    ('Pacific/Apia', '2011-12-30 10:00+00'), ('UTC', '2026-02-28 23:00+00')) AS z(tz, center)
 CROSS JOIN pg_catalog.generate_series(-150, 150, 37) AS m(m);
SELECT is_empty(
    $$SELECT p.expr, p.tz, p.after, queue._cron_next(p.expr, p.after, p.tz) AS got, b.want
        FROM probes p
       CROSS JOIN LATERAL (
             SELECT pg_catalog.min(l.l AT TIME ZONE p.tz) AS want
               FROM queue._cron_parse(p.expr) f,
                    pg_catalog.generate_series(pg_catalog.date_trunc('minute', p.after AT TIME ZONE p.tz) - interval '1 day',
                                               pg_catalog.date_trunc('minute', p.after AT TIME ZONE p.tz) + interval '9 days',
                                               interval '1 minute') AS l(l)
              WHERE pg_catalog.date_part('minute', l.l)::integer = ANY (f.minute)
                AND pg_catalog.date_part('hour', l.l)::integer = ANY (f.hour)
                AND pg_catalog.date_part('month', l.l)::integer = ANY (f.month)
                AND CASE WHEN f.dom_star OR f.dow_star
                         THEN pg_catalog.date_part('day', l.l)::integer = ANY (f.dom) AND pg_catalog.date_part('dow', l.l)::integer = ANY (f.dow)
                         ELSE pg_catalog.date_part('day', l.l)::integer = ANY (f.dom) OR pg_catalog.date_part('dow', l.l)::integer = ANY (f.dow) END
                AND (l.l AT TIME ZONE p.tz) > p.after) b
       WHERE queue._cron_next(p.expr, p.after, p.tz) IS DISTINCT FROM b.want$$,
    'the next tick equals the earliest matching wall-clock minute after it, by brute force, around DST changes (listed: mismatches)'
);

-- Never fires, bad arguments -----------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT queue._cron_next('0 0 30 2 *', '2026-01-01 00:00:00+00')$$, '22023', 'cron expression never fires',
                 '30 February never comes: 22023');
SELECT throws_ok($$SELECT queue._cron_next('0 0 31 4,6,9,11 *', '2026-01-01 00:00:00+00')$$, '22023', 'cron expression never fires',
                 'the 31st of months with 30 days never comes: 22023');
SELECT lives_ok($$SELECT queue._cron_next('0 0 31 2 1', '2026-01-01 00:00:00+00')$$,
                '31 February or any Monday in February: the day-of-week half fires');
SELECT throws_ok($$SELECT queue._cron_next('0 0 * * *', '2026-01-01 00:00:00+00', 'Mars/Olympus_Mons')$$, '22023', 'unknown time zone',
                 'an unknown time zone raises 22023');
SELECT throws_ok($$SELECT queue._cron_next('0 0 * * *', NULL)$$, '22004', 'after must not be NULL', 'a NULL after raises 22004');
SELECT throws_ok($$SELECT queue._cron_next('0 0 * * *', '2026-01-01 00:00:00+00', NULL)$$, '22004', 'timezone must not be NULL',
                 'a NULL time zone raises 22004');
SELECT throws_ok($$SELECT queue._cron_next('0 0 * * *', 'infinity')$$, '22023', 'after must be finite', 'an infinite after raises 22023');
SELECT throws_ok($$SELECT queue._cron_next('0 0 * *', '2026-01-01 00:00:00+00')$$, '22023', 'invalid cron expression',
                 'an invalid expression raises 22023 from the parser');

SELECT * FROM finish();
ROLLBACK;
