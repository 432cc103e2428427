-- queue.heartbeat: extends the lease of the current attempt; SK001 when the lease is lost.
-- now() is fixed for the transaction, so the new expiry compares exactly.
BEGIN;
SELECT plan(24);

DO $$
BEGIN
    PERFORM queue.configure_stage('hb.slow', lease_duration => interval '20 minutes');
    PERFORM queue.enqueue('{}', stage => 'hb');
    PERFORM queue.enqueue('{}', stage => 'hb.slow');
END
$$;
CREATE TEMP TABLE taken AS SELECT 'hb' AS stage, k.* FROM queue.take_next('hb', lease_for => interval '1 minute') k;
INSERT INTO taken SELECT 'hb.slow', k.* FROM queue.take_next('hb.slow', lease_for => interval '1 minute') k;
-- The role tests below read it under SET ROLE.
GRANT SELECT ON taken TO PUBLIC;

SELECT is((SELECT pg_catalog.count(*)::integer FROM taken), 2, 'setup: one running task in hb and one in hb.slow');

-- Extending the lease -------------------------------------------------------------------------------
SELECT is(queue.heartbeat(k.id, k.lease, lease_for => interval '10 minutes'), now() + interval '10 minutes',
          'heartbeat with lease_for returns now() + lease_for')
  FROM taken k WHERE k.stage = 'hb';
SELECT is(t.lease_expires, now() + interval '10 minutes', 'heartbeat stores the new expiry in the task')
  FROM queue.live_tasks t JOIN taken k ON k.id = t.id WHERE k.stage = 'hb';
SELECT results_eq(
    $$SELECT t.status::text, t.lease, t.attempt FROM queue.live_tasks t JOIN taken k ON k.id = t.id WHERE k.stage = 'hb'$$,
    $$SELECT 'running'::text, k.lease, 1 FROM taken k WHERE k.stage = 'hb'$$,
    'heartbeat keeps the task running under the same lease and attempt'
);
SELECT is(queue.heartbeat(k.id, k.lease, lease_for => interval '30 seconds'), now() + interval '30 seconds',
          'a shorter lease_for sets the expiry to now() + lease_for, also when that is sooner')
  FROM taken k WHERE k.stage = 'hb';
SELECT is(queue.heartbeat(k.id, k.lease), now() + interval '20 minutes',
          'without lease_for the lease is extended by the stage''s lease_duration')
  FROM taken k WHERE k.stage = 'hb.slow';
SELECT is(queue.heartbeat(k.id, k.lease),
          now() + (SELECT s.lease_duration FROM queue.stage_settings s WHERE s.stage = '*'),
          'a stage without settings uses the lease_duration of the ''*'' defaults row')
  FROM taken k WHERE k.stage = 'hb';
SELECT is(queue.heartbeat(k.id, k.lease, lease_for => interval '1 hour'), now() + interval '1 hour',
          'setup: the worker asks for an hour')
  FROM taken k WHERE k.stage = 'hb';
SELECT is(queue.heartbeat(k.id, k.lease), now() + interval '1 hour',
          'without lease_for a heartbeat never shortens a longer lease')
  FROM taken k WHERE k.stage = 'hb';

SET LOCAL ROLE skiplock_worker;
SELECT lives_ok(pg_catalog.format('SELECT queue.heartbeat(%s, %L)', k.id, k.lease), 'skiplock_worker may heartbeat')
  FROM taken k WHERE k.stage = 'hb';
RESET ROLE;
SET LOCAL ROLE skiplock_producer;
SELECT throws_ok(pg_catalog.format('SELECT queue.heartbeat(%s, %L)', k.id, k.lease),
                 '42501', 'permission denied for function heartbeat', 'skiplock_producer may not heartbeat (42501)')
  FROM taken k WHERE k.stage = 'hb';
RESET ROLE;

-- Errors: each raises its SQLSTATE and leaves the lease as it was -------------------------------------------
CREATE TEMP TABLE before_errors AS
SELECT pg_catalog.md5(pg_catalog.string_agg(t::text, '|' ORDER BY t.id)) AS digest FROM queue.live_tasks t;

SELECT throws_ok(pg_catalog.format('SELECT queue.heartbeat(%s, %L)', k.id, pg_catalog.gen_random_uuid()),
                 'SK001', 'lease lost', 'a lease that is not the task''s current one raises SK001 lease lost')
  FROM taken k WHERE k.stage = 'hb';
SELECT throws_ok(pg_catalog.format('SELECT queue.heartbeat(%s, %L)', k.id + 1000000, k.lease),
                 'SK001', 'lease lost', 'an unknown task id raises SK001 lease lost')
  FROM taken k WHERE k.stage = 'hb';
SELECT throws_ok($$SELECT queue.heartbeat(NULL, pg_catalog.gen_random_uuid())$$,
                 '22004', 'id and lease must not be NULL', 'a NULL id raises 22004');
SELECT throws_ok(pg_catalog.format('SELECT queue.heartbeat(%s, NULL)', k.id),
                 '22004', 'id and lease must not be NULL', 'a NULL lease raises 22004')
  FROM taken k WHERE k.stage = 'hb';
SELECT throws_ok(pg_catalog.format('SELECT queue.heartbeat(%s, %L, interval %L)', k.id, k.lease, '0'),
                 '22023', 'lease_for must be positive', 'lease_for => 0 raises 22023')
  FROM taken k WHERE k.stage = 'hb';
SELECT throws_ok(pg_catalog.format('SELECT queue.heartbeat(%s, %L, interval %L)', k.id, k.lease, '-5 minutes'),
                 '22023', 'lease_for must be positive', 'a negative lease_for raises 22023')
  FROM taken k WHERE k.stage = 'hb';
SELECT throws_ok(pg_catalog.format('SELECT queue.heartbeat(%s, %L)', k.id, 'not-a-uuid'),
                 '22P02', 'invalid input syntax for type uuid: "not-a-uuid"',
                 'a lease that is not a UUID raises 22P02')
  FROM taken k WHERE k.stage = 'hb';

SELECT is((SELECT pg_catalog.md5(pg_catalog.string_agg(t::text, '|' ORDER BY t.id)) FROM queue.live_tasks t),
          (SELECT digest FROM before_errors),
          'the failed heartbeats changed nothing (lease_expires included)');

-- Once the attempt is over its lease is lost ------------------------------------------------------------------
SELECT ok(queue.finish(k.id, k.lease), 'setup: the task in hb is finished')
  FROM taken k WHERE k.stage = 'hb';
SELECT throws_ok(pg_catalog.format('SELECT queue.heartbeat(%s, %L)', k.id, k.lease),
                 'SK001', 'lease lost', 'the lease of a finished task raises SK001 lease lost')
  FROM taken k WHERE k.stage = 'hb';

-- A retaken task: the old attempt's lease is lost, the new one works.
SELECT ok(queue.fail(k.id, k.lease, 'transient', retry_in => interval '0'), 'setup: the task in hb.slow fails, retry due now')
  FROM taken k WHERE k.stage = 'hb.slow';
INSERT INTO taken SELECT 'hb.slow retaken', k.* FROM queue.take_next('hb.slow') k;
SELECT throws_ok(pg_catalog.format('SELECT queue.heartbeat(%s, %L)', k.id, k.lease),
                 'SK001', 'lease lost', 'the lease of an earlier attempt of a retaken task raises SK001')
  FROM taken k WHERE k.stage = 'hb.slow';
SELECT is(queue.heartbeat(k.id, k.lease), now() + interval '20 minutes', 'the new attempt''s lease extends as usual')
  FROM taken k WHERE k.stage = 'hb.slow retaken';

SELECT * FROM finish();
ROLLBACK;
