-- queue.configure_stage: a row per stage, NULL keeps a value, '*' holds the defaults of stages
-- without a row, invalid values and names raise, and only skiplock_admin may call it.
BEGIN;
SELECT plan(52);

-- The defaults row as built; compared against below.
CREATE TEMP TABLE defaults_before AS SELECT s.* FROM queue.stage_settings s WHERE s.stage = '*';

SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.stage_settings s WHERE s.stage = 'cs.new'), 0,
          'setup: stage cs.new has no settings row yet');

-- A new stage: the values given, the rest from '*' --------------------------------------------------------
CREATE TEMP TABLE returned AS SELECT * FROM queue.configure_stage('cs.new', lease_duration => interval '2 minutes');

SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.stage_settings s WHERE s.stage = 'cs.new'), 1,
          'configure_stage creates a settings row for a stage that had none');
SELECT results_eq(
    $$SELECT s.lease_duration, s.max_attempts, s.backoff, s.backoff_base, s.backoff_cap, s.backoff_jitter, s.notify, s.updated,
             s.max_running, s.group_limit
        FROM queue.stage_settings s WHERE s.stage = 'cs.new'$$,
    $$SELECT interval '2 minutes', d.max_attempts, d.backoff, d.backoff_base, d.backoff_cap, d.backoff_jitter, d.notify, now(),
             d.max_running, d.group_limit
        FROM defaults_before d$$,
    'a new stage gets the values given; arguments left NULL take the value of the ''*'' row; updated is now()'
);
SELECT results_eq(
    $$SELECT r.* FROM returned r$$,
    $$SELECT s.* FROM queue.stage_settings s WHERE s.stage = 'cs.new'$$,
    'configure_stage returns the stage''s settings row as stored'
);

-- NULL keeps the current value --------------------------------------------------------------------------------
SELECT is((queue.configure_stage('cs.new', max_attempts => 3)).max_attempts, 3, 'a later call changes the value given');
SELECT results_eq(
    $$SELECT s.lease_duration, s.max_attempts, s.backoff, s.backoff_base, s.backoff_cap, s.backoff_jitter, s.notify
        FROM queue.stage_settings s WHERE s.stage = 'cs.new'$$,
    $$SELECT interval '2 minutes', 3, d.backoff, d.backoff_base, d.backoff_cap, d.backoff_jitter, d.notify
        FROM defaults_before d$$,
    'arguments left NULL keep the stage''s current values (lease_duration stays 2 minutes)'
);
SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.stage_settings s WHERE s.stage = 'cs.new'), 1,
          'configuring a stage again updates its row, adds none');

SELECT results_eq(
    $$SELECT d.max_running, d.group_limit FROM defaults_before d$$,
    $$VALUES (NULL::integer, NULL::integer)$$,
    'as built, the defaults row caps nothing: max_running and group_limit are NULL'
);

-- Concurrency limits: set, keep, remove with 0 -------------------------------------------------------------
SELECT results_eq(
    $$SELECT s.max_running, s.group_limit FROM queue.configure_stage('cs.lim', max_running => 3, group_limit => 1) s$$,
    $$VALUES (3, 1)$$,
    'max_running and group_limit are stored and returned'
);
SELECT results_eq(
    $$SELECT s.max_running, s.group_limit, s.max_attempts FROM queue.configure_stage('cs.lim', max_attempts => 4) s$$,
    $$VALUES (3, 1, 4)$$,
    'a call without them keeps both limits'
);
SELECT results_eq(
    $$SELECT s.max_running, s.group_limit FROM queue.configure_stage('cs.lim', max_running => 0) s$$,
    $$VALUES (NULL::integer, 1)$$,
    'max_running => 0 removes the stage cap (stored as NULL) and keeps group_limit'
);
SELECT results_eq(
    $$SELECT s.max_running, s.group_limit FROM queue.configure_stage('cs.lim', group_limit => 0, max_running => 2) s$$,
    $$VALUES (2, NULL::integer)$$,
    'group_limit => 0 removes the group cap; max_running can be set in the same call'
);
SELECT lives_ok($$SELECT queue.configure_stage('cs.lim', max_running => 1, group_limit => 1)$$,
                'the smallest caps, max_running 1 and group_limit 1, are accepted');

-- Every value at once, positional -----------------------------------------------------------------------------
SELECT lives_ok($$SELECT queue.configure_stage('cs.full', interval '1 minute', 2, 'linear', interval '5 seconds',
                                               interval '10 minutes', 0.5, false, 7, 2)$$,
                'configure_stage accepts every setting in one call');
SELECT results_eq(
    $$SELECT s.lease_duration, s.max_attempts, s.backoff, s.backoff_base, s.backoff_cap, s.backoff_jitter, s.notify,
             s.max_running, s.group_limit
        FROM queue.stage_settings s WHERE s.stage = 'cs.full'$$,
    $$VALUES (interval '1 minute', 2, 'linear'::text, interval '5 seconds', interval '10 minutes', 0.5::real, false, 7, 2)$$,
    'every setting given is stored'
);
SELECT lives_ok($$SELECT queue.configure_stage('cs.edge', max_attempts => 1, backoff_base => interval '0',
                                               backoff_cap => interval '0', backoff_jitter => 0)$$,
                'boundary values are accepted: max_attempts 1, zero delays, jitter 0');
SELECT lives_ok($$SELECT queue.configure_stage('cs.edge', backoff_jitter => 1)$$, 'jitter 1 is accepted');

-- The '*' row: defaults of every stage without a row ------------------------------------------------------------
SELECT is((queue.configure_stage('*', lease_duration => interval '3 minutes', max_attempts => 9)).stage, '*',
          'configure_stage(''*'') returns the defaults row');
SELECT results_eq(
    $$SELECT s.lease_duration, s.max_attempts, s.backoff FROM queue.stage_settings s WHERE s.stage = '*'$$,
    $$SELECT interval '3 minutes', 9, d.backoff FROM defaults_before d$$,
    'configure_stage(''*'') changes the defaults row and keeps what was not given'
);
SELECT is((queue.configure_stage('*', max_running => 5)).max_running, 5, 'the defaults row may carry a max_running');
SELECT results_eq(
    $$SELECT (queue._settings('cs.none')).max_running, (queue._settings('cs.lim')).max_running$$,
    $$VALUES (5, 1)$$,
    'a stage without a row is capped by the default max_running; a stage with its own row keeps its own'
);
SELECT is((queue.configure_stage('*', max_running => 0)).max_running, NULL, 'max_running => 0 removes the default cap again');
SELECT results_eq(
    $$SELECT (queue._settings('cs.none')).lease_duration, (queue._settings('cs.none')).max_attempts$$,
    $$VALUES (interval '3 minutes', 9)$$,
    'a stage without a row now resolves to the new defaults (queue._settings)'
);

DO $$
BEGIN
    PERFORM queue.enqueue('{}', stage => 'cs.none');
    PERFORM queue.enqueue('{}', stage => 'cs.new');
END
$$;
SELECT is((SELECT k.lease_expires FROM queue.take_next('cs.none') k), now() + interval '3 minutes',
          'take_next in a stage without a row leases for the new default lease_duration');
SELECT is((SELECT k.lease_expires FROM queue.take_next('cs.new') k), now() + interval '2 minutes',
          'a stage with its own row keeps its own lease_duration after the defaults change');
SELECT results_eq(
    $$SELECT s.lease_duration, s.max_attempts FROM queue.configure_stage('cs.later', backoff => 'linear') s$$,
    $$VALUES (interval '3 minutes', 9)$$,
    'a stage configured after the defaults changed starts from the new defaults'
);

-- Roles: admin only -------------------------------------------------------------------------------------------------
SET LOCAL ROLE skiplock_producer;
SELECT throws_ok($$SELECT queue.configure_stage('cs.roles', max_attempts => 2)$$,
                 '42501', 'permission denied for function configure_stage',
                 'skiplock_producer may not configure a stage (42501)');
RESET ROLE;
SET LOCAL ROLE skiplock_worker;
SELECT throws_ok($$SELECT queue.configure_stage('cs.roles', max_attempts => 2)$$,
                 '42501', 'permission denied for function configure_stage',
                 'skiplock_worker may not configure a stage (42501)');
RESET ROLE;
SET LOCAL ROLE skiplock_monitor;
SELECT throws_ok($$SELECT queue.configure_stage('cs.roles', max_attempts => 2)$$,
                 '42501', 'permission denied for function configure_stage',
                 'skiplock_monitor may not configure a stage (42501)');
RESET ROLE;
SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.stage_settings s WHERE s.stage = 'cs.roles'), 0,
          'the refused calls created no row');
SET LOCAL ROLE skiplock_admin;
SELECT lives_ok($$SELECT queue.configure_stage('cs.roles', max_attempts => 2)$$,
                'skiplock_admin may configure a stage');
RESET ROLE;
SELECT is((SELECT s.max_attempts FROM queue.stage_settings s WHERE s.stage = 'cs.roles'), 2,
          'the admin''s call was stored');

-- Errors: each raises its SQLSTATE and changes nothing ------------------------------------------------------------------
CREATE TEMP TABLE before_errors AS
SELECT pg_catalog.md5(pg_catalog.string_agg(s::text, '|' ORDER BY s.stage)) AS digest FROM queue.stage_settings s;

SELECT throws_ok($$SELECT queue.configure_stage('cs.new', lease_duration => interval '0')$$,
                 '22023', 'invalid stage setting', 'lease_duration 0 raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('cs.new', lease_duration => interval '-1 minute')$$,
                 '22023', 'invalid stage setting', 'a negative lease_duration raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('cs.new', max_attempts => 0)$$,
                 '22023', 'invalid stage setting', 'max_attempts 0 raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('cs.new', backoff => 'random')$$,
                 '22023', 'invalid stage setting', 'an unknown backoff raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('cs.new', backoff_jitter => 2)$$,
                 '22023', 'invalid stage setting', 'jitter 2 raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('cs.new', backoff_jitter => -0.1)$$,
                 '22023', 'invalid stage setting', 'a negative jitter raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('cs.new', backoff_base => interval '-1 second')$$,
                 '22023', 'invalid stage setting', 'a negative backoff_base raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('cs.new', backoff_cap => interval '-1 second')$$,
                 '22023', 'invalid stage setting', 'a negative backoff_cap raises 22023');
SELECT throws_ok(format('SELECT queue.configure_stage(%L, %s => interval ''101 years'')', 'cs.new', a),
                 '22023', 'invalid stage setting', format('%s over 100 years raises 22023 (now() + it could leave the timestamp range)', a))
  FROM unnest(ARRAY['lease_duration', 'backoff_base', 'backoff_cap']) a;
SELECT throws_ok($$SELECT queue.configure_stage('*', max_attempts => 0)$$,
                 '22023', 'invalid stage setting', 'an invalid default raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('cs.fresh', backoff => 'random')$$,
                 '22023', 'invalid stage setting', 'an invalid value for a new stage raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('cs.new', max_running => -1)$$,
                 '22023', 'invalid max_running', 'a negative max_running raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('cs.new', group_limit => -1)$$,
                 '22023', 'invalid group_limit', 'a negative group_limit raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('*', max_running => -5)$$,
                 '22023', 'invalid max_running', 'a negative default max_running raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('', max_attempts => 2)$$,
                 '22023', 'invalid stage name', 'an empty stage name raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage(pg_catalog.repeat('s', 55), max_attempts => 2)$$,
                 '22023', 'invalid stage name', 'a 55-byte stage name raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage(NULL, max_attempts => 2)$$,
                 '22004', 'stage must not be NULL', 'a NULL stage raises 22004');

SELECT is((SELECT pg_catalog.md5(pg_catalog.string_agg(s::text, '|' ORDER BY s.stage)) FROM queue.stage_settings s),
          (SELECT digest FROM before_errors),
          'the failed calls changed no settings and created no row');

SELECT * FROM finish();
ROLLBACK;
