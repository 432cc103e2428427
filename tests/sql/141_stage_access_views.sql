-- Per-stage access in the monitoring views: a restricted stage's rows show only to members of a
-- role granted on it (either right) and of skiplock_admin, enforced by the views themselves
-- (queue._hidden_stages), so a tenant's login with skiplock_monitor reads no other tenant's stage
-- in psql. Every view granted to skiplock_monitor is checked, each both ways (the tenant sees its
-- own rows there, so a check that found nothing for the wrong reason would fail).
BEGIN;
SELECT plan(32);

CREATE ROLE skiplock_t_group_a NOLOGIN;
CREATE ROLE skiplock_t_group_b NOLOGIN;
CREATE ROLE skiplock_t_tenant_a LOGIN IN ROLE skiplock_producer, skiplock_worker, skiplock_monitor, skiplock_t_group_a;
CREATE ROLE skiplock_t_tenant_b LOGIN IN ROLE skiplock_monitor, skiplock_t_group_b;
CREATE ROLE skiplock_t_watcher LOGIN IN ROLE skiplock_monitor;
CREATE ROLE skiplock_t_admin LOGIN IN ROLE skiplock_admin;

SELECT queue.grant_stage('a.jobs', 'skiplock_t_group_a');
SELECT queue.grant_stage('b.jobs', 'skiplock_t_group_b', enqueue => false);  -- a take-only grant
SELECT queue.configure_stage('open.jobs', max_attempts => 1);
SELECT queue.configure_stage(s, max_attempts => 1) FROM unnest(ARRAY['a.jobs', 'b.jobs']) s;

-- Each stage: one task done, one fatal (history), one failed with a retry left ('error' needs
-- max_attempts > 1: a fourth task in a second stage setting), one ready.
CREATE FUNCTION pg_temp.fill(p_stage text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE v record;
BEGIN
    PERFORM queue.enqueue('{"n": 1}', p_stage);
    PERFORM queue.enqueue('{"n": 2}', p_stage);
    SELECT * INTO v FROM queue.take_next(p_stage);
    PERFORM queue.finish(v.id, v.lease);
    SELECT * INTO v FROM queue.take_next(p_stage);
    PERFORM queue.fail(v.id, v.lease, 'broke in ' || p_stage);
    PERFORM queue.configure_stage(p_stage, max_attempts => 5);
    PERFORM queue.enqueue('{"n": 3}', p_stage);
    SELECT * INTO v FROM queue.take_next(p_stage);
    PERFORM queue.fail(v.id, v.lease, 'retrying in ' || p_stage);
    PERFORM queue.enqueue('{"n": 4}', p_stage);
END
$$;
SELECT pg_temp.fill(s) FROM unnest(ARRAY['a.jobs', 'b.jobs', 'open.jobs']) s;
INSERT INTO queue.finished_dropped (stage, status, total)
VALUES ('a.jobs', 'done', 5), ('b.jobs', 'done', 5), ('open.jobs', 'done', 5)
ON CONFLICT DO NOTHING;

-- The stages each view lists, as a role sees it.
CREATE FUNCTION pg_temp.stages_of(p_view text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE v text;
BEGIN
    EXECUTE pg_catalog.format('SELECT string_agg(DISTINCT stage, '','' ORDER BY stage) FROM queue.%I WHERE stage <> ''*''', p_view) INTO v;
    RETURN v;
END
$$;
GRANT EXECUTE ON FUNCTION pg_temp.stages_of(text) TO PUBLIC;
CREATE TEMP TABLE views AS
SELECT c.relname::text AS name
  FROM pg_catalog.pg_class c
 WHERE c.relnamespace = 'queue'::regnamespace AND c.relkind = 'v'
   AND pg_catalog.has_table_privilege('skiplock_monitor', c.oid, 'SELECT');
GRANT SELECT ON views TO PUBLIC;
SELECT is((SELECT string_agg(name, ',' ORDER BY name) FROM views),
          'errors,finished_totals,hourly,metrics,stage_config,stats,tasks',
          'the views granted to skiplock_monitor are the seven checked here (a new one must be added)');

CREATE TEMP TABLE b_ids AS SELECT id FROM queue.live_tasks WHERE stage = 'b.jobs' UNION SELECT id FROM queue.history WHERE stage = 'b.jobs';
GRANT SELECT ON b_ids TO PUBLIC;

SET ROLE skiplock_t_tenant_a;
SELECT is(pg_temp.stages_of(name), 'a.jobs,open.jobs', 'tenant A (granted a.jobs) sees its stage and the open one in queue.' || name) FROM views ORDER BY name;
SELECT is((SELECT count(*) FROM queue.tasks WHERE id IN (SELECT id FROM b_ids)), 0::bigint, 'tenant A reads no row of b.jobs from queue.tasks even by id');
SELECT is(queue._hidden_stages(), ARRAY['b.jobs'], '_hidden_stages() of tenant A is b.jobs');
RESET ROLE;

SET ROLE skiplock_t_tenant_b;
SELECT is(pg_temp.stages_of(name), 'b.jobs,open.jobs', 'tenant B (granted take only on b.jobs) sees its stage and the open one in queue.' || name) FROM views ORDER BY name;
RESET ROLE;

SET ROLE skiplock_t_watcher;
SELECT is(pg_temp.stages_of(name), 'open.jobs', 'a monitor granted no stage sees only the open one in queue.' || name) FROM views ORDER BY name;
RESET ROLE;

SET ROLE skiplock_t_admin;
SELECT is(pg_temp.stages_of(name), 'a.jobs,b.jobs,open.jobs', 'an admin sees every stage in queue.' || name) FROM views ORDER BY name;
SELECT is(queue._hidden_stages(), '{}'::text[], '_hidden_stages() of an admin is empty');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
