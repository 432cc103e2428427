-- Per-stage access (tenants): grant_stage restricts a stage to listed roles. Tenant A's worker,
-- knowing tenant B's task ids, can neither enqueue into, take from, see, nor finish B's tasks,
-- through any API function or view; admins bypass; open stages stay open; revoke reopens.
BEGIN;
SELECT plan(76);

-- Roles are cluster-wide, but created in this transaction they roll back with it.
CREATE ROLE skiplock_t_group_a NOLOGIN;
CREATE ROLE skiplock_t_group_b NOLOGIN;
CREATE ROLE skiplock_t_tenant_a LOGIN IN ROLE skiplock_producer, skiplock_worker, skiplock_sql, skiplock_t_group_a;
CREATE ROLE skiplock_t_tenant_b LOGIN IN ROLE skiplock_producer, skiplock_worker, skiplock_t_group_b;
CREATE ROLE skiplock_t_admin LOGIN IN ROLE skiplock_admin;

-- sqlstate | detail | hint of a statement, run as the current role.
CREATE FUNCTION pg_temp.error_of(query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_state text; v_detail text; v_hint text;
BEGIN
    EXECUTE query;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
    RETURN v_state || ' | ' || v_detail || ' | ' || v_hint;
END
$$;
CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, lease uuid);
GRANT ALL ON took TO PUBLIC;

-- grant_stage: argument checks, and what it writes.
SELECT throws_ok($$SELECT queue.grant_stage(NULL, 'skiplock_t_group_a')$$, '22004', NULL, 'grant_stage: a NULL stage is 22004');
SELECT throws_ok($$SELECT queue.grant_stage('*', 'skiplock_t_group_a')$$, '22023', NULL, 'grant_stage: the defaults row ''*'' cannot be restricted (22023)');
SELECT throws_ok($$SELECT queue.grant_stage('a.jobs', NULL)$$, '22004', NULL, 'grant_stage: a NULL role is 22004');
SELECT throws_ok($$SELECT queue.grant_stage('a.jobs', 'skiplock_t_group_a', take => NULL)$$, '22004', NULL, 'grant_stage: a NULL right is 22004');
SELECT throws_ok($$SELECT queue.revoke_stage(NULL, 'skiplock_t_group_a')$$, '22004', NULL, 'revoke_stage: a NULL stage is 22004');
SELECT throws_ok($$SELECT queue.revoke_stage('', 'skiplock_t_group_a')$$, '22023', NULL, 'revoke_stage: an empty stage is 22023');
SELECT throws_ok($$SELECT queue.revoke_stage('a.jobs', NULL)$$, '22004', NULL, 'revoke_stage: a NULL role is 22004');
SELECT is((SELECT count(*) FROM queue.stage_settings WHERE stage = 'a.jobs'), 0::bigint, 'rejected grants wrote nothing');

UPDATE queue.stage_settings SET max_attempts = 7 WHERE stage = '*';
SELECT lives_ok($$SELECT queue.grant_stage('a.jobs', 'skiplock_t_group_a')$$, 'grant_stage restricts a.jobs to tenant A''s group');
SELECT lives_ok($$SELECT queue.grant_stage('b.jobs', 'skiplock_t_group_b')$$, 'grant_stage restricts b.jobs to tenant B''s group');
SELECT is(restricted, true, 'stage_settings.restricted is set for a.jobs') FROM queue.stage_settings WHERE stage = 'a.jobs';
SELECT is((SELECT (lease_duration, max_attempts, backoff, backoff_base, backoff_cap, backoff_jitter, notify, max_running, group_limit, paused)::text
             FROM queue.stage_settings WHERE stage = 'a.jobs'),
          (SELECT (lease_duration, max_attempts, backoff, backoff_base, backoff_cap, backoff_jitter, notify, max_running, group_limit, paused)::text
             FROM queue.stage_settings WHERE stage = '*'),
          'the settings row grant_stage creates holds the ''*'' defaults');
SELECT results_eq($$SELECT stage, role::text, may_enqueue, may_take FROM queue.stage_access ORDER BY stage$$,
                  $$VALUES ('a.jobs', 'skiplock_t_group_a', true, true), ('b.jobs', 'skiplock_t_group_b', true, true)$$,
                  'stage_access lists one role per stage with both rights');
SELECT is((queue.configure_stage('a.jobs', max_attempts => 3)).restricted, true, 'configure_stage keeps a stage restricted');
SELECT is((queue.configure_stage('open.jobs', max_attempts => 3)).restricted, false, 'configure_stage creates open stages');

-- Tenant B fills its stage: b1 running (B holds its lease), b2 ready.
SET ROLE skiplock_t_tenant_b;
SELECT lives_ok($$INSERT INTO took (name, id) VALUES ('b1', queue.enqueue('{"t": "b1"}', 'b.jobs', key => 'b-1'))$$, 'tenant B enqueues into its stage');
SELECT is(cardinality(array(SELECT queue.enqueue_batch(ARRAY['{"t": "b2"}']::jsonb[], 'b.jobs'))), 1, 'tenant B batch-enqueues into its stage');
UPDATE took SET lease = k.lease FROM queue.take_next('b.jobs') k WHERE took.id = k.id;
SELECT isnt(lease, NULL, 'tenant B takes from its stage') FROM took WHERE name = 'b1';
RESET ROLE;
INSERT INTO took (name, id) SELECT 'b2', id FROM queue.live_tasks WHERE stage = 'b.jobs' AND status = 'ready';
CREATE TEMP TABLE b_before AS SELECT * FROM queue.live_tasks WHERE stage = 'b.jobs';

-- Tenant A against B's stage and tasks.
SET ROLE skiplock_t_tenant_a;
SELECT throws_ok($$SELECT queue.enqueue('{}', 'b.jobs')$$, '42501', 'permission denied for stage b.jobs', 'A cannot enqueue into b.jobs');
SELECT is(pg_temp.error_of($$SELECT queue.enqueue('{}', 'b.jobs')$$),
          '42501 | Stage ''b.jobs'' is restricted and role skiplock_t_tenant_a has no enqueue right on it. | An admin can allow it: SELECT queue.grant_stage(''b.jobs'', ''skiplock_t_tenant_a'');',
          'the denial names stage and role and hints at grant_stage');
SELECT throws_ok($$SELECT queue.enqueue('{}', 'b.jobs', key => 'b-1', mode => 'rerun')$$, '42501', NULL, 'A cannot re-run B''s keyed task');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], 'b.jobs')$$, '42501', NULL, 'A cannot batch-enqueue into b.jobs');
-- The restriction is the stage's own row: it holds even with the defaults row '*' deleted by hand.
RESET ROLE;
SAVEPOINT without_defaults;
DELETE FROM queue.stage_settings WHERE stage = '*';
SET ROLE skiplock_t_tenant_a;
SELECT throws_ok($$SELECT queue.enqueue('{}', 'b.jobs')$$, '42501', NULL, 'A cannot enqueue into b.jobs even without the defaults row ''*''');
RESET ROLE;
ROLLBACK TO SAVEPOINT without_defaults;
SET ROLE skiplock_t_tenant_a;
SELECT throws_ok($$SELECT * FROM queue.take_next('b.jobs')$$, '42501', 'permission denied for stage b.jobs', 'A cannot take from b.jobs (denied, not an empty result)');
SELECT is(pg_temp.error_of($$SELECT * FROM queue.take_next('b.jobs', batch => 5)$$),
          '42501 | Stage ''b.jobs'' is restricted and role skiplock_t_tenant_a has no take right on it. | An admin can allow it: SELECT queue.grant_stage(''b.jobs'', ''skiplock_t_tenant_a'');',
          'the take denial names the take right');
-- The lease fences what follows: A knows B's ids but not B's lease.
SELECT throws_ok(format('SELECT queue.heartbeat(%s, %L)', id, gen_random_uuid()), 'SK001', NULL, 'A cannot heartbeat B''s task with a guessed lease') FROM took WHERE name = 'b1';
SELECT is(queue.finish(id, gen_random_uuid()), false, 'A cannot finish B''s task with a guessed lease') FROM took WHERE name = 'b1';
SELECT is(queue.finish(id, gen_random_uuid(), next_stage => 'a.jobs'), false, 'A cannot move B''s task into its own stage') FROM took WHERE name = 'b1';
SELECT is(queue.finish_batch(ARRAY[id], ARRAY[gen_random_uuid()]), 0, 'A cannot batch-finish B''s task') FROM took WHERE name = 'b1';
SELECT is(queue.fail(id, gen_random_uuid(), 'sabotage', fatal => true), false, 'A cannot fail B''s task') FROM took WHERE name = 'b1';
SELECT is(queue.release(id, gen_random_uuid()), false, 'A cannot release B''s task') FROM took WHERE name = 'b1';
SELECT is(queue.release(id, '00000000-0000-0000-0000-000000000000'), false, 'A cannot release B''s ready task with a null-like lease') FROM took WHERE name = 'b2';
SELECT throws_ok($$SELECT * FROM queue.finish_and_take(NULL, NULL, 'b.jobs')$$, '42501', 'permission denied for stage b.jobs', 'A cannot take from b.jobs through finish_and_take');
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT 1', stage => 'b.jobs')$$, '42501', 'permission denied for stage b.jobs', 'A cannot enqueue an SQL task into b.jobs');
SELECT is((SELECT f.finished FROM queue.finish_and_take(t.id, gen_random_uuid(), 'a.jobs') f LIMIT 1), false,
          'finish_and_take with a guessed lease of B''s task finishes nothing') FROM took t WHERE t.name = 'b1';
-- Admin-only functions: A's worker/producer roles lack EXECUTE.
SELECT throws_ok(format('SELECT queue.cancel(%s)', id), '42501', NULL, 'A cannot cancel B''s task') FROM took WHERE name = 'b2';
SELECT throws_ok(format('SELECT queue.retry(%s)', id), '42501', NULL, 'A cannot retry B''s task') FROM took WHERE name = 'b2';
SELECT throws_ok(format('SELECT queue.set_priority(%s, -100)', id), '42501', NULL, 'A cannot reprioritise B''s task') FROM took WHERE name = 'b2';
SELECT throws_ok($$SELECT queue.configure_stage('b.jobs', paused => true)$$, '42501', NULL, 'A cannot configure (pause) B''s stage');
SELECT throws_ok($$SELECT queue.configure_history(retention => interval '1 day')$$, '42501', NULL, 'A cannot configure_history');
SELECT throws_ok($$SELECT * FROM queue.rotate_partitions()$$, '42501', NULL, 'A cannot rotate_partitions');
SELECT throws_ok($$SELECT * FROM queue.maintain()$$, '42501', NULL, 'A cannot maintain');
SELECT throws_ok($$SELECT queue.reap_hung()$$, '42501', NULL, 'A cannot reap_hung (and so free B''s leases)');
SELECT throws_ok($$SELECT queue.schedule('evil', '* * * * *', 'b.jobs')$$, '42501', NULL, 'A cannot schedule into b.jobs');
SELECT throws_ok($$SELECT queue.unschedule('any')$$, '42501', NULL, 'A cannot unschedule');
SELECT throws_ok($$SELECT queue.fire_schedules()$$, '42501', NULL, 'A cannot fire_schedules');
SELECT throws_ok($$SELECT queue.grant_stage('b.jobs', 'skiplock_t_group_a')$$, '42501', NULL, 'A cannot grant itself B''s stage');
SELECT throws_ok($$SELECT queue.revoke_stage('b.jobs', 'skiplock_t_group_b')$$, '42501', NULL, 'A cannot open B''s stage by revoking');
-- Nothing to read: views and tables are closed to workers and producers.
SELECT throws_ok($$SELECT * FROM queue.tasks$$, '42501', NULL, 'A cannot read queue.tasks');
SELECT throws_ok($$SELECT * FROM queue.stats$$, '42501', NULL, 'A cannot read queue.stats');
SELECT throws_ok($$SELECT * FROM queue.errors$$, '42501', NULL, 'A cannot read queue.errors');
SELECT throws_ok($$SELECT * FROM queue.hourly$$, '42501', NULL, 'A cannot read queue.hourly');
SELECT throws_ok($$SELECT * FROM queue.metrics$$, '42501', NULL, 'A cannot read queue.metrics');
SELECT throws_ok($$SELECT * FROM queue.live_tasks$$, '42501', NULL, 'A cannot read queue.live_tasks');
SELECT throws_ok($$SELECT * FROM queue.stage_access$$, '42501', NULL, 'A cannot read queue.stage_access');
-- A works normally on its own stage and on open stages.
SELECT isnt(queue.enqueue('{"t": "a1"}', 'a.jobs'), NULL, 'A enqueues into a.jobs');
SELECT is(cardinality(array(SELECT queue.enqueue_batch(ARRAY['{"t": "a2"}']::jsonb[], 'a.jobs'))), 1, 'A batch-enqueues into a.jobs');
SELECT is(queue.finish(k.id, k.lease), true, 'A takes and finishes its own task') FROM queue.take_next('a.jobs') k;
SELECT isnt(queue.enqueue('{"t": "o1"}', 'open.jobs'), NULL, 'A enqueues into an open stage');
INSERT INTO took (name, id, lease) SELECT 'o1', k.id, k.lease FROM queue.take_next('open.jobs') k;
SELECT throws_ok(format('SELECT queue.finish(%s, %L, next_stage => %L)', id, lease, 'b.jobs'), '42501', 'permission denied for stage b.jobs',
                 'A cannot push a task into b.jobs through finish(next_stage)') FROM took WHERE name = 'o1';
SELECT is(queue.finish(id, lease), true, 'the task A took from an open stage is still A''s to finish') FROM took WHERE name = 'o1';
RESET ROLE;

SELECT results_eq($$SELECT * FROM queue.live_tasks WHERE stage = 'b.jobs' ORDER BY id$$,
                  $$SELECT * FROM b_before ORDER BY id$$,
                  'B''s tasks are unchanged after all of A''s attempts');
SELECT is((SELECT count(*) FROM queue.history WHERE stage = 'b.jobs'), 0::bigint, 'none of B''s tasks was finished');

-- B's own lease still works.
SET ROLE skiplock_t_tenant_b;
SELECT isnt(queue.heartbeat(id, lease), NULL, 'B heartbeats its task') FROM took WHERE name = 'b1';
SELECT is(queue.finish(id, lease), true, 'B finishes its task') FROM took WHERE name = 'b1';
RESET ROLE;

-- Admins bypass the restriction.
SET ROLE skiplock_t_admin;
SELECT isnt(queue.enqueue('{"t": "adm"}', 'b.jobs'), NULL, 'an admin enqueues into a restricted stage');
SELECT is((SELECT count(*) FROM queue.take_next('b.jobs')), 1::bigint, 'an admin takes from a restricted stage');
SELECT lives_ok($$SELECT queue.grant_stage('a.jobs', 'skiplock_t_group_b', enqueue => true, take => false)$$, 'an admin lets B enqueue into a.jobs, not take');
RESET ROLE;

-- Rights are separate: B may enqueue into a.jobs but not take from it.
SET ROLE skiplock_t_tenant_b;
SELECT isnt(queue.enqueue('{"t": "b-to-a"}', 'a.jobs'), NULL, 'B enqueues into a.jobs with the enqueue right');
SELECT throws_ok($$SELECT * FROM queue.take_next('a.jobs')$$, '42501', NULL, 'B still cannot take from a.jobs');
RESET ROLE;

-- revoke_stage: the stage reopens only when its last role goes.
SELECT is(queue.revoke_stage('a.jobs', 'skiplock_t_group_b'), true, 'revoke_stage removes B from a.jobs');
SELECT is(restricted, true, 'a.jobs stays restricted while A is listed') FROM queue.stage_settings WHERE stage = 'a.jobs';
SELECT is(queue.revoke_stage('b.jobs', 'skiplock_t_group_b'), true, 'revoke_stage removes B''s last row from b.jobs');
SELECT is(restricted, false, 'b.jobs is open again') FROM queue.stage_settings WHERE stage = 'b.jobs';
SELECT is(queue.revoke_stage('b.jobs', 'skiplock_t_group_b'), false, 'revoking again returns false');
SET ROLE skiplock_t_tenant_a;
SELECT is((SELECT count(*) FROM queue.take_next('b.jobs')), 1::bigint, 'A may take from the reopened b.jobs');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
