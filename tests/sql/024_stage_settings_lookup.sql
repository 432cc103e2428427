-- A stage's own row of queue.stage_settings wins; a stage without one follows the defaults row '*'.
-- take_next and take_locked read them by two primary-key probes (revision 0018): both halves matter.
BEGIN;
SELECT plan(10);

-- 'sl.own' gets its row (a copy of the defaults) before the defaults change, so it keeps the old ones.
DO $$ BEGIN PERFORM queue.configure_stage('sl.own', lease_duration => interval '7 minutes'); END $$;
DO $$ BEGIN PERFORM queue.configure_stage('*', lease_duration => interval '3 minutes'); END $$;
DO $$ BEGIN PERFORM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[4]), 'sl.own');
            PERFORM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2]), 'sl.none'); END $$;

SELECT ok((SELECT t.lease_expires - now() BETWEEN interval '179 seconds' AND interval '181 seconds'
             FROM queue.take_next('sl.none') t),
          'a stage without a row gets the lease of the defaults row');
SELECT ok((SELECT t.lease_expires - now() BETWEEN interval '419 seconds' AND interval '421 seconds'
             FROM queue.take_next('sl.own') t),
          'a stage with its own row gets its own lease, not the changed default');

DO $$ BEGIN PERFORM queue.configure_stage('*', paused => true); END $$;
SELECT is_empty($$SELECT 1 FROM queue.take_next('sl.none')$$,
                'take_next: paused defaults pause a stage without a row');
SELECT is_empty($$SELECT 1 FROM queue.take_locked('sl.none')$$,
                'take_locked: paused defaults pause a stage without a row');
SELECT is((SELECT count(*)::integer FROM queue.take_next('sl.own')), 1,
          'take_next: a stage with its own row is not paused by the defaults');
SELECT is((SELECT count(*)::integer FROM queue.take_locked('sl.own')), 1,
          'take_locked: a stage with its own row is not paused by the defaults');
DO $$ BEGIN PERFORM queue.configure_stage('*', paused => false); END $$;

DO $$ BEGIN PERFORM queue.configure_stage('*', max_running => 2); END $$;
SELECT throws_ok($$SELECT * FROM queue.take_locked('sl.none')$$, '0A000', NULL,
                 'take_locked refuses a stage without a row when the defaults carry a limit');
SELECT is((SELECT count(*)::integer FROM queue.take_locked('sl.own')), 1,
          'take_locked serves a stage whose own row has no limit');
DO $$ BEGIN PERFORM queue.configure_stage('*', max_running => 0); END $$;

-- enqueue reads restricted and notify the same way; a restricted stage's own row wins over open defaults.
DO $$ BEGIN PERFORM queue.grant_stage('sl.locked', 'skiplock_admin'); END $$;
SELECT is((SELECT restricted FROM queue.stage_settings WHERE stage = 'sl.locked'), true,
          'grant_stage gives the stage a restricted row of its own');
SET LOCAL ROLE skiplock_producer;
SELECT throws_ok($$SELECT queue.enqueue('{}', 'sl.locked')$$, '42501', NULL,
                 'enqueue into a restricted stage by a role it does not list raises 42501');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
