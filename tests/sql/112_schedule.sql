-- queue.schedule, queue.unschedule, queue.fire_schedules: create, replace and remove named cron
-- schedules; errors change nothing; fire_schedules with an injected now fires once per due tick,
-- skips missed ticks without a burst, never fires early, and enqueues the schedule's payload,
-- stage and priority under the key schedule:<name>:<tick>.
-- now() is fixed for the transaction; firing uses injected times in 2030.
BEGIN;
SELECT plan(84);

-- Creating --------------------------------------------------------------------------------------------------------
SELECT is(queue.schedule('s.every5', '*/5 * * * *', stage => 'sch.a', payload => '{"job": "a"}', priority => 3),
          queue._cron_next('*/5 * * * *', now()),
          'schedule returns the first tick after now');
SELECT results_eq(
    $$SELECT s.name, s.cron, s.stage, s.payload, s.priority, s.timezone, s.next_fire, s.last_fired, s.created, s.updated
        FROM queue.schedules s WHERE s.name = 's.every5'$$,
    $$VALUES ('s.every5'::text, '*/5 * * * *'::text, 'sch.a'::text, '{"job": "a"}'::jsonb, 3, 'UTC'::text,
              queue._cron_next('*/5 * * * *', now()), NULL::timestamptz, now(), now())$$,
    'the schedule is stored as given; next_fire is its next tick; never fired; created and updated now()');
SELECT lives_ok($$SELECT queue.schedule('s.defaults', '@daily')$$, 'schedule(name, cron) alone');
SELECT results_eq(
    $$SELECT s.stage, s.payload, s.priority, s.timezone, s.next_fire FROM queue.schedules s WHERE s.name = 's.defaults'$$,
    $$VALUES ('default'::text, '{}'::jsonb, 0, 'UTC'::text, queue._cron_next('0 0 * * *', now()))$$,
    'defaults: stage ''default'', payload {}, priority 0, time zone UTC');
SELECT is(queue.schedule('s.berlin', '0 9 * * 1-5', timezone => 'Europe/Berlin'),
          queue._cron_next('0 9 * * 1-5', now(), 'Europe/Berlin'),
          'with a time zone, the next tick is wall-clock time there');

-- Replacing -------------------------------------------------------------------------------------------------------
UPDATE queue.schedules s
   SET next_fire = '2030-01-01 00:05:00+00', created = now() - interval '1 day', updated = now() - interval '1 day'
 WHERE s.name = 's.every5';
SELECT is(queue.schedule('s.every5', '*/5 * * * *', stage => 'sch.b', payload => '[2]', priority => 7),
          '2030-01-01 00:05:00+00'::timestamptz,
          'replacing with the same cron and time zone keeps the pending tick (and returns it)');
SELECT results_eq(
    $$SELECT s.stage, s.payload, s.priority, s.next_fire, s.created, s.updated FROM queue.schedules s WHERE s.name = 's.every5'$$,
    $$VALUES ('sch.b'::text, '[2]'::jsonb, 7, '2030-01-01 00:05:00+00'::timestamptz, now() - interval '1 day', now())$$,
    'replacing changes stage, payload and priority, keeps created, sets updated');
SELECT is(queue.schedule('s.every5', '*/10 * * * *', stage => 'sch.b', payload => '[2]', priority => 7),
          queue._cron_next('*/10 * * * *', now()),
          'replacing with another cron starts from the first tick of the new one after now');
SELECT is(queue.schedule('s.every5', '*/10 * * * *', stage => 'sch.b', payload => '[2]', priority => 7, timezone => 'Asia/Kolkata'),
          queue._cron_next('*/10 * * * *', now(), 'Asia/Kolkata'),
          'replacing with another time zone recomputes the next tick');
UPDATE queue.schedules s
   SET last_fired = now() + interval '1 day', next_fire = now() + interval '1 day 10 minutes'
 WHERE s.name = 's.every5';
SELECT is(queue.schedule('s.every5', '*/5 * * * *'), queue._cron_next('*/5 * * * *', now() + interval '1 day'),
          'a new cron never fires a tick at or before the last fired one, even when that lies after now');
SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.schedules s WHERE s.name = 's.every5'), 1,
          'one row per name however often it is replaced');

-- Errors: each raises and changes nothing --------------------------------------------------------------------------
CREATE TEMP TABLE before AS SELECT s.* FROM queue.schedules s;
SELECT throws_ok($$SELECT queue.schedule(NULL, '* * * * *')$$, '22004', 'name must not be NULL', 'a NULL name raises 22004');
SELECT throws_ok($$SELECT queue.schedule('', '* * * * *')$$, '22023', 'invalid schedule name', 'an empty name raises 22023');
SELECT throws_ok(pg_catalog.format('SELECT queue.schedule(%L, %L)', pg_catalog.repeat('n', 201), '* * * * *'),
                 '22023', 'invalid schedule name', 'a name over 200 characters raises 22023');
SELECT lives_ok(pg_catalog.format('SELECT queue.schedule(%L, %L)', pg_catalog.repeat('n', 200), '* * * * *'),
                'a name of 200 characters is accepted');
SELECT throws_ok($$SELECT queue.schedule('s.err', NULL)$$, '22004', 'cron expression must not be NULL', 'a NULL cron raises 22004');
SELECT throws_ok($$SELECT queue.schedule('s.err', '* * *')$$, '22023', 'invalid cron expression', 'a cron with 3 fields raises 22023');
SELECT throws_ok($$SELECT queue.schedule('s.err', '61 * * * *')$$, '22023', 'invalid cron expression', 'minute 61 raises 22023');
SELECT throws_ok(pg_catalog.format('SELECT queue.schedule(%L, %L)', 's.err', pg_catalog.repeat('1,', 500) || '1 * * * *'),
                 '22023', 'invalid cron expression', 'a cron over 1000 characters raises 22023');
SELECT throws_ok($$SELECT queue.schedule('s.err', '0 0 30 2 *')$$, '22023', 'cron expression never fires', 'a cron that never fires raises 22023');
SELECT throws_ok($$SELECT queue.schedule('s.err', '* * * * *', stage => NULL)$$, '22004', 'stage must not be NULL', 'a NULL stage raises 22004');
SELECT throws_ok($$SELECT queue.schedule('s.err', '* * * * *', stage => '*')$$, '22023', 'invalid stage name', 'stage ''*'' raises 22023');
SELECT throws_ok($$SELECT queue.schedule('s.err', '* * * * *', payload => NULL)$$, '22004', 'payload must not be NULL', 'a NULL payload raises 22004');
SELECT throws_ok($$SELECT queue.schedule('s.err', '* * * * *', payload => '42')$$, '22023', 'payload must be a JSON object or array',
                 'a scalar payload raises 22023');
SELECT throws_ok($$SELECT queue.schedule('s.err', '* * * * *', priority => NULL)$$, '22004', 'priority must not be NULL', 'a NULL priority raises 22004');
SELECT throws_ok($$SELECT queue.schedule('s.err', '* * * * *', timezone => 'Mars/Olympus_Mons')$$, '22023', 'unknown time zone',
                 'an unknown time zone raises 22023');
SELECT throws_ok($$SELECT queue.schedule('s.err', '0 12 * * *', timezone => '+02:00')$$, '22023', 'unknown time zone',
                 'an offset such as +02:00 (which PostgreSQL reads as UTC-2) raises 22023');
SELECT throws_ok($$SELECT queue.schedule('s.err', '0 12 * * *', timezone => 'XYZ+1')$$, '22023', 'unknown time zone',
                 'a POSIX zone string raises 22023');
SELECT lives_ok($$SELECT queue.schedule('s.utc_lower', '0 12 * * *', timezone => 'utc'); SELECT queue.unschedule('s.utc_lower')$$,
                'a time zone name in another case is accepted');
SELECT throws_ok($$SELECT queue.schedule('s.err', '* * * * *', timezone => '')$$, '22023', 'unknown time zone', 'an empty time zone raises 22023');
SELECT throws_ok($$SELECT queue.schedule('s.err', '* * * * *', timezone => NULL)$$, '22004', 'timezone must not be NULL', 'a NULL time zone raises 22004');
SELECT throws_ok($$SELECT queue.schedule('s.every5', '* * * * 8')$$, '22023', 'invalid cron expression',
                 'replacing an existing schedule with an invalid cron raises 22023');
SELECT throws_ok($$SELECT queue.schedule('s.every5', '*/5 * * * *', timezone => 'Nowhere/Land')$$, '22023', 'unknown time zone',
                 'replacing an existing schedule with an unknown time zone raises 22023');
DELETE FROM queue.schedules s WHERE s.name = pg_catalog.repeat('n', 200);
SELECT set_eq($$SELECT s.* FROM queue.schedules s$$, $$SELECT b.* FROM before b$$,
              'the failed calls created, changed and removed nothing');

-- Unscheduling ----------------------------------------------------------------------------------------------------
SELECT is(queue.unschedule('s.defaults'), true, 'unschedule of an existing schedule returns true');
SELECT is_empty($$SELECT 1 FROM queue.schedules s WHERE s.name = 's.defaults'$$, 'and removes it');
SELECT is(queue.unschedule('s.defaults'), false, 'unschedule again returns false (idempotent, no error)');
SELECT is(queue.unschedule('s.never-was'), false, 'unschedule of an unknown name returns false');
SELECT throws_ok($$SELECT queue.unschedule(NULL)$$, '22004', 'name must not be NULL', 'unschedule(NULL) raises 22004');

-- Firing ----------------------------------------------------------------------------------------------------------
-- Only the schedules below: the others would be due at the injected times too.
SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.schedules s WHERE queue.unschedule(s.name)), 2,
          'setup: the schedules made above are removed');
DO $$
BEGIN
    PERFORM queue.schedule('f.five', '*/5 * * * *', stage => 'sch.fire', payload => '{"job": "five"}', priority => 3);
    PERFORM queue.schedule('f.hourly', '@hourly', stage => 'sch.fire', payload => '[1, 2]', priority => -1);
END
$$;
UPDATE queue.schedules s SET next_fire = '2030-01-01 00:05:00+00' WHERE s.name = 'f.five';
UPDATE queue.schedules s SET next_fire = '2030-01-01 01:00:00+00' WHERE s.name = 'f.hourly';
CREATE TEMP VIEW fired AS
SELECT t.key, t.stage, t.payload, t.priority, t.status::text AS status, t.run_at
  FROM queue.live_tasks t
 WHERE t.key LIKE 'schedule:%';

SELECT is(queue.fire_schedules('2030-01-01 00:04:59.999999+00'), 0, 'a microsecond before the tick nothing fires');
SELECT is_empty($$SELECT 1 FROM fired$$, 'and nothing is enqueued');
SELECT is(queue.fire_schedules('2030-01-01 00:05:00+00'), 1, 'at the tick the schedule fires: one task');
SELECT results_eq(
    $$SELECT f.key, f.stage, f.payload, f.priority, f.status, f.run_at FROM fired f$$,
    $$VALUES ('schedule:f.five:2030-01-01T00:05:00Z'::text, 'sch.fire'::text, '{"job": "five"}'::jsonb, 3, 'ready'::text, now())$$,
    'the task has the schedule''s payload, stage and priority, is ready now, and is keyed by schedule and tick');
SELECT results_eq(
    $$SELECT s.next_fire, s.last_fired FROM queue.schedules s WHERE s.name = 'f.five'$$,
    $$VALUES ('2030-01-01 00:10:00+00'::timestamptz, '2030-01-01 00:05:00+00'::timestamptz)$$,
    'next_fire moves to the next tick; last_fired is the tick fired');
SELECT is(queue.fire_schedules('2030-01-01 00:05:00+00'), 0, 'firing again at the same time enqueues nothing');
SELECT is(queue.fire_schedules('2030-01-01 00:09:59+00'), 0, 'nor before the next tick');
SELECT is((SELECT pg_catalog.count(*)::integer FROM fired), 1, 'still one task');
SELECT is(queue.fire_schedules('2030-01-01 00:10:30+00'), 1, 'a call after the next tick fires it');
SELECT is((SELECT f.key FROM fired f ORDER BY f.key DESC LIMIT 1), 'schedule:f.five:2030-01-01T00:10:00Z',
          'keyed by the tick (00:10), not by the time of the call');

-- Missed ticks: one task, for the latest due tick.
SELECT is(queue.fire_schedules('2030-01-01 00:58:00+00'), 1, 'after missing nine ticks: one task, not a burst');
SELECT results_eq(
    $$SELECT s.next_fire, s.last_fired FROM queue.schedules s WHERE s.name = 'f.five'$$,
    $$VALUES ('2030-01-01 01:00:00+00'::timestamptz, '2030-01-01 00:55:00+00'::timestamptz)$$,
    'it fires the latest due tick (00:55); next_fire is the first tick after now');
SELECT is((SELECT pg_catalog.count(*)::integer FROM fired f WHERE f.key = 'schedule:f.five:2030-01-01T00:55:00Z'), 1,
          'the task is keyed by the latest due tick');
SELECT is(queue.fire_schedules('2030-01-01 01:00:00+00'), 2, 'two schedules due at once: two tasks');
SELECT results_eq(
    $$SELECT f.payload, f.priority FROM fired f WHERE f.key = 'schedule:f.hourly:2030-01-01T01:00:00Z'$$,
    $$VALUES ('[1, 2]'::jsonb, -1)$$,
    'each task carries its own schedule''s payload and priority');
SELECT is(queue.fire_schedules('2030-02-28 23:57:30+00'), 2, 'after an outage of two months: one task per schedule');
SELECT results_eq(
    $$SELECT s.name, s.last_fired, s.next_fire FROM queue.schedules s ORDER BY s.name$$,
    $$VALUES ('f.five'::text, '2030-02-28 23:55:00+00'::timestamptz, '2030-03-01 00:00:00+00'::timestamptz),
             ('f.hourly'::text, '2030-02-28 23:00:00+00'::timestamptz, '2030-03-01 00:00:00+00'::timestamptz)$$,
    'after the outage each schedule fired its latest due tick and waits for its next one');
SELECT results_eq(
    $$SELECT f.key FROM fired f ORDER BY f.key$$,
    $$VALUES ('schedule:f.five:2030-01-01T00:05:00Z'::text), ('schedule:f.five:2030-01-01T00:10:00Z'),
             ('schedule:f.five:2030-01-01T00:55:00Z'), ('schedule:f.five:2030-01-01T01:00:00Z'),
             ('schedule:f.five:2030-02-28T23:55:00Z'), ('schedule:f.hourly:2030-01-01T01:00:00Z'),
             ('schedule:f.hourly:2030-02-28T23:00:00Z')$$,
    'seven tasks in all, one per fired tick');

-- The key: a tick whose task is still live is never enqueued again, even if the row were set back
-- (a restore, a hand edit; the table's CHECK keeps next_fire after last_fired).
UPDATE queue.schedules s SET next_fire = '2030-02-28 23:55:00+00', last_fired = NULL WHERE s.name = 'f.five';
SELECT is(queue.fire_schedules('2030-02-28 23:57:30+00'), 0,
          'with next_fire set back to a tick already enqueued, firing enqueues nothing and counts nothing');
SELECT is((SELECT pg_catalog.count(*)::integer FROM fired), 7, 'still seven tasks');
SELECT is((SELECT s.next_fire FROM queue.schedules s WHERE s.name = 'f.five'), '2030-03-01 00:00:00+00'::timestamptz,
          'and next_fire moves on past now');

-- Unscheduling leaves the tasks it enqueued.
SELECT is(queue.unschedule('f.hourly'), true, 'unschedule of a schedule that fired');
SELECT is((SELECT pg_catalog.count(*)::integer FROM fired f WHERE f.key LIKE 'schedule:f.hourly:%'), 2,
          'its enqueued tasks stay queued');
SELECT is(queue.fire_schedules('2030-03-01 01:00:00+00'), 1, 'and it fires no more (only f.five is due)');
SELECT is(queue.unschedule('f.five'), true, 'unschedule the other one too');

-- Time zones: the next tick follows the zone's clock (Berlin changes to CEST on 31 March 2030).
DO $$
BEGIN
    PERFORM queue.schedule('f.berlin', '0 9 * * *', stage => 'sch.tz', timezone => 'Europe/Berlin');
END
$$;
UPDATE queue.schedules s SET next_fire = '2030-03-30 08:00:00+00' WHERE s.name = 'f.berlin';
SELECT is(queue.fire_schedules('2030-03-30 08:00:00+00'), 1, 'a Berlin schedule fires at 09:00 CET (08:00 UTC)');
SELECT is((SELECT s.next_fire FROM queue.schedules s WHERE s.name = 'f.berlin'), '2030-03-31 07:00:00+00'::timestamptz,
          'its next tick is 09:00 CEST, 07:00 UTC, after the change');
SELECT is((SELECT f.key FROM fired f WHERE f.stage = 'sch.tz'), 'schedule:f.berlin:2030-03-30T08:00:00Z', 'keys give the tick in UTC');
-- Zone names that are also abbreviations: zone CET keeps summer time, zone EST is UTC-5 whatever
-- the firing session's timezone_abbreviations (Australia: EST is UTC+10).
DO $$
BEGIN
    PERFORM queue.unschedule('f.berlin');
    PERFORM queue.schedule('f.cet', '0 12 * * *', stage => 'sch.tz2', timezone => 'CET');
    PERFORM queue.schedule('f.est', '0 12 * * *', stage => 'sch.tz2', timezone => 'EST');
END
$$;
UPDATE queue.schedules s SET next_fire = '2030-07-01 10:00:00+00' WHERE s.name = 'f.cet';
UPDATE queue.schedules s SET next_fire = '2030-07-01 17:00:00+00' WHERE s.name = 'f.est';
SET LOCAL timezone_abbreviations = 'Australia';
SELECT is(queue.fire_schedules('2030-07-01 17:00:00+00'), 2, 'setup: both fire');
RESET timezone_abbreviations;
SELECT results_eq(
    $$SELECT s.name, s.next_fire FROM queue.schedules s WHERE s.name IN ('f.cet', 'f.est') ORDER BY s.name$$,
    $$VALUES ('f.cet'::text, timestamptz '2030-07-02 10:00:00+00'), ('f.est', '2030-07-02 17:00:00+00')$$,
    'zone CET''s next noon is 10:00 UTC in summer (CEST), zone EST''s 17:00 UTC, not the abbreviations'' 11:00 and 02:00'
);

-- Arguments.
UPDATE queue.schedules s SET next_fire = now() + interval '1 microsecond', last_fired = NULL;
SELECT is(queue.fire_schedules(), 0, 'fire_schedules() uses now(): a tick a microsecond after it is not due');
SELECT is(queue.fire_schedules(now() + interval '1 microsecond'), (SELECT count(*)::integer FROM queue.schedules),
          'and every schedule is due a microsecond later');
SELECT throws_ok($$SELECT queue.fire_schedules(NULL)$$, '22004', 'now must not be NULL', 'fire_schedules(NULL) raises 22004');
SELECT throws_ok($$SELECT queue.fire_schedules('infinity')$$, '22023', 'now must be finite', 'fire_schedules(''infinity'') raises 22023');

-- Roles ------------------------------------------------------------------------------------------------------------
SET LOCAL ROLE skiplock_admin;
SELECT lives_ok($$SELECT queue.schedule('r.admin', '@hourly')$$, 'skiplock_admin may schedule');
SELECT lives_ok($$SELECT queue.fire_schedules('2030-01-01 00:00:00+00')$$, 'skiplock_admin may fire_schedules');
SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.schedules s WHERE s.name = 'r.admin'), 1,
          'skiplock_admin may read queue.schedules');
SELECT lives_ok($$SELECT queue.unschedule('r.admin')$$, 'skiplock_admin may unschedule');
SELECT throws_ok($$DELETE FROM queue.schedules$$, '42501', 'permission denied for table schedules',
                 'skiplock_admin may not write queue.schedules directly');
RESET ROLE;
SET LOCAL ROLE skiplock_monitor;
SELECT lives_ok($$SELECT pg_catalog.count(*) FROM queue.schedules$$, 'skiplock_monitor may read queue.schedules');
SELECT throws_ok($$UPDATE queue.schedules SET priority = 0$$, '42501', 'permission denied for table schedules',
                 'skiplock_monitor may not write queue.schedules');
SELECT throws_ok($$SELECT queue.schedule('r.monitor', '@hourly')$$, '42501', 'permission denied for function schedule',
                 'skiplock_monitor may not schedule');
RESET ROLE;
SET LOCAL ROLE skiplock_producer;
SELECT throws_ok($$SELECT queue.fire_schedules()$$, '42501', 'permission denied for function fire_schedules',
                 'skiplock_producer may not fire_schedules');
SELECT throws_ok($$SELECT queue.unschedule('f.five')$$, '42501', 'permission denied for function unschedule',
                 'skiplock_producer may not unschedule');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
