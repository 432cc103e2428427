-- queue.configure_history and queue.history_policy: one row with the documented defaults, NULL
-- keeps a value, every accepted interval is accepted, every invalid value raises 22023 and
-- changes nothing, and only skiplock_admin may call it.
BEGIN;
SELECT plan(45);

-- The one row, as built -------------------------------------------------------------------------------------
SELECT results_eq(
    $$SELECT p.partition_interval, p.premake, p.retention, p.retention_action, p.rotate_every FROM queue.history_policy p$$,
    $$VALUES (interval '1 day', 7, interval '30 days', 'drop'::text, interval '10 minutes')$$,
    'history_policy holds one row with the defaults: daily partitions, 7 ahead, 30 days kept, dropped, rotated every 10 minutes');
SELECT throws_ok($$INSERT INTO queue.history_policy (one) VALUES (true)$$, '23505', NULL,
                 'a second policy row is refused (primary key on the constant true)');
SELECT throws_ok($$INSERT INTO queue.history_policy (one) VALUES (false)$$, '23514', NULL,
                 'a row with one = false is refused (CHECK), so there is never more than one');

-- Changing it -----------------------------------------------------------------------------------------------
CREATE TEMP TABLE returned AS SELECT * FROM queue.configure_history(retention => interval '14 days');
SELECT results_eq($$SELECT r.* FROM returned r$$, $$SELECT p.* FROM queue.history_policy p$$,
                  'configure_history returns the policy row as stored');
SELECT results_eq(
    $$SELECT p.partition_interval, p.premake, p.retention, p.retention_action, p.rotate_every, p.updated FROM queue.history_policy p$$,
    $$VALUES (interval '1 day', 7, interval '14 days', 'drop'::text, interval '10 minutes', now())$$,
    'it changes the value given, keeps those left NULL, and sets updated');
SELECT lives_ok($$SELECT queue.configure_history('1 hour', 48, '2 days', 'detach', '5 minutes')$$,
                'every setting may be given at once, positionally');
SELECT results_eq(
    $$SELECT p.partition_interval, p.premake, p.retention, p.retention_action, p.rotate_every FROM queue.history_policy p$$,
    $$VALUES (interval '1 hour', 48, interval '2 days', 'detach'::text, interval '5 minutes')$$,
    'every setting given is stored');
SELECT is((SELECT count(*)::integer FROM queue.history_policy), 1, 'still exactly one row');

-- Accepted intervals: those that tile a UTC day, a day, a week ---------------------------------------------------
SELECT lives_ok(format('SELECT queue.configure_history(partition_interval => %L, premake => 24, retention => %L)', i, '7 days'),
                format('partition_interval %s is accepted', i))
  FROM unnest(ARRAY['1 hour', '2 hours', '3 hours', '4 hours', '6 hours', '8 hours', '12 hours', '1 day', '7 days', '1 week']) i;
SELECT is((SELECT p.partition_interval FROM queue.history_policy p), interval '7 days', '''1 week'' is stored as 7 days');
SELECT lives_ok($$SELECT queue.configure_history(partition_interval => '1 day', premake => 1, retention => '1 day', rotate_every => '23 hours')$$,
                'boundaries: premake 1, retention equal to the interval, rotate_every just under interval * premake');
SELECT lives_ok($$SELECT queue.configure_history(premake => 1000)$$, 'premake 1000 is accepted');

-- Invalid values: 22023, nothing changes ------------------------------------------------------------------------
SELECT lives_ok($$SELECT queue.configure_history('1 day', 7, '30 days', 'drop', '10 minutes')$$, 'setup: back to the defaults');
CREATE TEMP TABLE before_errors AS SELECT p.* FROM queue.history_policy p;

SELECT throws_ok(format('SELECT queue.configure_history(partition_interval => %L)', i), '22023', 'invalid history setting',
                 format('partition_interval %s raises 22023 (it does not tile a day or a week)', i))
  FROM unnest(ARRAY['5 hours', '90 minutes', '30 minutes', '2 days', '1 month', '0', '-1 day']) i;
SELECT throws_ok($$SELECT queue.configure_history(premake => 0)$$, '22023', 'invalid history setting', 'premake 0 raises 22023');
SELECT throws_ok($$SELECT queue.configure_history(premake => 1001)$$, '22023', 'invalid history setting', 'premake 1001 raises 22023');
SELECT throws_ok($$SELECT queue.configure_history(retention => '23 hours')$$, '22023', 'invalid history setting',
                 'a retention shorter than the partition interval raises 22023');
SELECT throws_ok($$SELECT queue.configure_history(retention => '0')$$, '22023', 'invalid history setting', 'retention 0 raises 22023');
SELECT throws_ok($$SELECT queue.configure_history(retention_action => 'delete')$$, '22023', 'invalid history setting',
                 'retention_action other than drop or detach raises 22023');
SELECT throws_ok($$SELECT queue.configure_history(rotate_every => '0')$$, '22023', 'invalid history setting', 'rotate_every 0 raises 22023');
SELECT throws_ok($$SELECT queue.configure_history(rotate_every => '-1 minute')$$, '22023', 'invalid history setting',
                 'a negative rotate_every raises 22023');
SELECT throws_ok($$SELECT queue.configure_history(rotate_every => '7 days')$$, '22023', 'invalid history setting',
                 'rotate_every not below partition_interval * premake (rotation would fall behind) raises 22023');
SELECT throws_ok($$SELECT queue.configure_history(partition_interval => '1 hour', premake => 1, rotate_every => '1 hour')$$,
                 '22023', 'invalid history setting', 'the rule holds across settings changed together');
SELECT throws_ok($$SELECT queue.configure_history(retention => '10000 years')$$, '22023', 'invalid history setting',
                 'a retention over 1000 years raises 22023 (rotation would leave the timestamp range)');
SELECT throws_ok($$SELECT queue.configure_history(partition_interval => '1 mon -29 days')$$, '22023', 'invalid history setting',
                 'a partition_interval with months raises 22023, though it equals 1 day (date_bin refuses months)');
SELECT results_eq($$SELECT p.* FROM queue.history_policy p$$, $$SELECT b.* FROM before_errors b$$,
                  'the refused calls changed nothing');

-- Roles: admin only -----------------------------------------------------------------------------------------------
SET LOCAL ROLE skiplock_producer;
SELECT throws_ok($$SELECT queue.configure_history(premake => 3)$$, '42501', 'permission denied for function configure_history',
                 'skiplock_producer may not configure history (42501)');
RESET ROLE;
SET LOCAL ROLE skiplock_worker;
SELECT throws_ok($$SELECT queue.configure_history(premake => 3)$$, '42501', 'permission denied for function configure_history',
                 'skiplock_worker may not configure history (42501)');
RESET ROLE;
SET LOCAL ROLE skiplock_monitor;
SELECT throws_ok($$SELECT queue.configure_history(premake => 3)$$, '42501', 'permission denied for function configure_history',
                 'skiplock_monitor may not configure history (42501)');
RESET ROLE;
SET LOCAL ROLE skiplock_admin;
SELECT is((queue.configure_history(premake => 3)).premake, 3, 'skiplock_admin may configure history');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
