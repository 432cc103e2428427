-- Plan guard: with a realistic backlog, the claim queries of take_next and take_locked walk the
-- partial index live_tasks_claim in order (no Seq Scan, no Sort), and reap_hung's selection reads
-- the partial index live_tasks_running. A change of the indexes or of the queries that loses this shows
-- here before it shows as a slow queue.
--
-- The queries below are COPIES of the ones in schema/functions/take_next.sql (CTE "picked"),
-- take_locked.sql and reap_hung.sql (subquery of "expired"), with the function's arguments as
-- literals or parameters. They must be kept in step: the first tests check that the functions
-- still contain them (whitespace aside), so a change there fails here until the copy is updated.
BEGIN;
SELECT plan(17);

SELECT ok(
    pg_catalog.regexp_replace(p.prosrc, '\s+', ' ', 'g') LIKE
        '%SELECT c.id FROM queue.live_tasks c WHERE c.stage = take_next.stage AND c.status IN (''ready'', ''error'') AND c.run_as IS NULL AND c.run_at <= v_now AND (c.priority, c.run_at, c.id) >= (v_from_priority, v_from_run_at, v_from_id) ORDER BY c.priority, c.run_at, c.id LIMIT take_next.batch FOR UPDATE SKIP LOCKED%',
    'take_next still contains the claim query copied below'
)
  FROM pg_catalog.pg_proc p WHERE p.oid = 'queue.take_next(text,integer,interval,text)'::regprocedure;

SELECT ok(
    pg_catalog.regexp_replace(p.prosrc, '\s+', ' ', 'g') LIKE
        '%UPDATE queue.live_tasks t SET status = ''running'', attempt = t.attempt + 1, lease = pg_catalog.md5(v_lease_seed || t.id::text)::uuid, lease_expires = v_now + v_lease, started = v_now, updated = v_now, worker = take_next.worker WHERE t.stage = take_next.stage AND t.id = ANY (ARRAY( SELECT c.id FROM queue.live_tasks c %',
    'take_next still updates the claimed rows by = ANY (ARRAY(claim query)), as copied below'
)
  FROM pg_catalog.pg_proc p WHERE p.oid = 'queue.take_next(text,integer,interval,text)'::regprocedure;

SELECT ok(
    pg_catalog.regexp_replace(p.prosrc, '\s+', ' ', 'g') LIKE
        '%SELECT c.priority FROM queue.live_tasks c WHERE c.stage = take_next.stage AND c.status IN (''ready'', ''error'') AND c.run_as IS NULL AND c.priority < v_from_priority AND c.run_at <= v_now ORDER BY c.priority, c.run_at, c.id LIMIT 1%',
    'take_next still probes for a lower priority number with the query copied below'
)
  FROM pg_catalog.pg_proc p WHERE p.oid = 'queue.take_next(text,integer,interval,text)'::regprocedure;

SELECT ok(
    pg_catalog.regexp_replace(p.prosrc, '\s+', ' ', 'g') LIKE
        '%SELECT c.id, c.payload, c.attempt + 1 AS attempt, c.priority, c.key, c.run_at FROM queue.live_tasks c WHERE c.stage = take_locked.stage AND c.status IN (''ready'', ''error'') AND c.run_as IS NULL AND c.run_at <= v_now AND (v_held_ids IS NULL OR c.id <> ALL (v_held_ids)) AND (c.priority, c.run_at, c.id) >= (v_from_priority, v_from_run_at, v_from_id) ORDER BY c.priority, c.run_at, c.id LIMIT take_locked.batch FOR UPDATE SKIP LOCKED%',
    'take_locked still contains the claim query copied below'
)
  FROM pg_catalog.pg_proc p WHERE p.oid = 'queue.take_locked(text,integer)'::regprocedure;

SELECT ok(
    pg_catalog.regexp_replace(p.prosrc, '\s+', ' ', 'g') LIKE
        '%SELECT l.id, l.stage, l.attempt, l.rerun, l.worker, l.lease_expires FROM queue.live_tasks l WHERE l.status = ''running'' AND l.lease_expires < v_now AND (v_of IS NULL OR l.stage = v_of) ORDER BY l.lease_expires LIMIT 10000 FOR UPDATE SKIP LOCKED%',
    'reap_hung still contains the selection query copied below'
)
  FROM pg_catalog.pg_proc p WHERE p.oid = 'queue.reap_hung()'::regprocedure;

-- A backlog: 20,000 tasks over 4 stages with priorities -3..3 and run_at over the last 100 s.
-- Half of each stage is finished (moved to queue.history); of the live ones, 1 in 10 is running
-- (leases expiring around now) and 1 in 10 waits for a retry. Rows are picked by g, not by id:
-- ids depend on what the sequence handed out before.
INSERT INTO queue.live_tasks (stage, priority, run_at, payload)
SELECT 'plan.s' || (g % 4), (g % 7) - 3, pg_catalog.now() - (g % 100) * interval '1 second',
       pg_catalog.jsonb_build_object('g', g)
  FROM pg_catalog.generate_series(1, 20000) AS g;

WITH gone AS (
    DELETE FROM queue.live_tasks t
     WHERE t.stage LIKE 'plan.s%' AND ((t.payload->>'g')::integer / 4) % 2 = 1
    RETURNING t.*
)
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, key, attempt, worker,
                           error_text, created, started, finished)
SELECT g.id, g.stage, 'done', g.priority, g.run_at, g.payload, g.key, 1, 'plan-test',
       NULL, g.created, pg_catalog.now(), pg_catalog.now()
  FROM gone g;

UPDATE queue.live_tasks t
   SET status = 'running', attempt = 1, lease = pg_catalog.gen_random_uuid(), started = pg_catalog.now(),
       lease_expires = pg_catalog.now() + ((t.id % 60) - 30) * interval '1 second'
 WHERE t.stage LIKE 'plan.s%' AND ((t.payload->>'g')::integer / 4) % 20 = 0;
UPDATE queue.live_tasks t
   SET status = 'error', attempt = 1, error_text = 'plan test', run_at = pg_catalog.now() + interval '1 minute'
 WHERE t.stage LIKE 'plan.s%' AND ((t.payload->>'g')::integer / 4) % 20 = 2;

ANALYZE queue.live_tasks;

SELECT results_eq(
    $$SELECT t.stage, pg_catalog.count(*)::integer FROM queue.live_tasks t WHERE t.stage LIKE 'plan.s%' GROUP BY t.stage ORDER BY t.stage$$,
    $$VALUES ('plan.s0'::text, 2500), ('plan.s1', 2500), ('plan.s2', 2500), ('plan.s3', 2500)$$,
    'setup: 10,000 live tasks (and 10,000 in history), 2,500 in each of 4 stages'
);

-- EXPLAIN (FORMAT JSON) of a query, and what its plan holds.
CREATE FUNCTION pg_temp.plan_of(query text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_plan jsonb;
BEGIN
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || query INTO v_plan;
    RETURN v_plan;
END
$$;
CREATE FUNCTION pg_temp.uses_index(plan jsonb, index_name text) RETURNS boolean LANGUAGE sql AS $$
    SELECT pg_catalog.jsonb_path_exists(plan, 'strict $.** ? (@."Index Name" == $name)',
                                        pg_catalog.jsonb_build_object('name', index_name))
$$;
CREATE FUNCTION pg_temp.has_node(plan jsonb, node_type text) RETURNS boolean LANGUAGE sql AS $$
    SELECT pg_catalog.jsonb_path_exists(plan, 'strict $.** ? (@."Node Type" == $type)',
                                        pg_catalog.jsonb_build_object('type', node_type))
$$;

PREPARE claim(text, timestamptz, integer, integer, timestamptz, bigint) AS
SELECT c.id
  FROM queue.live_tasks c
 WHERE c.stage = $1
   AND c.status IN ('ready', 'error')
   AND c.run_as IS NULL
   AND c.run_at <= $2
   AND (c.priority, c.run_at, c.id) >= ($4, $5, $6)
 ORDER BY c.priority, c.run_at, c.id
 LIMIT $3
   FOR UPDATE SKIP LOCKED;

-- take_next's probe for a due task before its claim position.
PREPARE probe(text, timestamptz, integer) AS
SELECT c.priority
  FROM queue.live_tasks c
 WHERE c.stage = $1
   AND c.status IN ('ready', 'error')
   AND c.run_as IS NULL
   AND c.priority < $3
   AND c.run_at <= $2
 ORDER BY c.priority, c.run_at, c.id
 LIMIT 1;

-- The whole claim statement (take_next keeps one generic plan: plan_cache_mode=force_generic_plan).
-- Joining the claimed ids from a CTE instead planned a Hash Join over a Seq Scan of live_tasks.
PREPARE claim_update(text, timestamptz, integer, interval, text, integer, timestamptz, bigint) AS
UPDATE queue.live_tasks t
   SET status = 'running', attempt = t.attempt + 1, lease = pg_catalog.md5('seed' || t.id::text)::uuid,
       lease_expires = $2 + $4, started = $2, updated = $2, worker = $5
 WHERE t.stage = $1 AND t.id = ANY (ARRAY(
        SELECT c.id
          FROM queue.live_tasks c
         WHERE c.stage = $1
           AND c.status IN ('ready', 'error')
           AND c.run_as IS NULL
           AND c.run_at <= $2
           AND (c.priority, c.run_at, c.id) >= ($6, $7, $8)
         ORDER BY c.priority, c.run_at, c.id
         LIMIT $3
           FOR UPDATE SKIP LOCKED))
RETURNING t.id, t.payload, t.attempt, t.lease, t.lease_expires, t.priority, t.key, t.run_at;

-- take_locked's claim (CTE "claimed"): the same index walk, returning the rows it locks.
PREPARE claim_locked(text, timestamptz, integer, integer, timestamptz, bigint, bigint[]) AS
SELECT c.id, c.payload, c.attempt + 1 AS attempt, c.priority, c.key, c.run_at
  FROM queue.live_tasks c
 WHERE c.stage = $1
   AND c.status IN ('ready', 'error')
   AND c.run_as IS NULL
   AND c.run_at <= $2
   AND ($7 IS NULL OR c.id <> ALL ($7))
   AND (c.priority, c.run_at, c.id) >= ($4, $5, $6)
 ORDER BY c.priority, c.run_at, c.id
 LIMIT $3
   FOR UPDATE SKIP LOCKED;

PREPARE reap(timestamptz, text) AS
SELECT l.id, l.stage, l.attempt, l.rerun, l.worker, l.lease_expires
  FROM queue.live_tasks l
 WHERE l.status = 'running' AND l.lease_expires < $1
   AND ($2 IS NULL OR l.stage = $2)
 ORDER BY l.lease_expires
 LIMIT 10000
   FOR UPDATE SKIP LOCKED;

CREATE TEMP TABLE plans (name text PRIMARY KEY, plan jsonb);
-- With the values written in (what a custom plan sees).
INSERT INTO plans VALUES ('claim', pg_temp.plan_of($q$
SELECT c.id
  FROM queue.live_tasks c
 WHERE c.stage = 'plan.s1'
   AND c.status IN ('ready', 'error')
   AND c.run_as IS NULL
   AND c.run_at <= now()
   AND (c.priority, c.run_at, c.id) >= (0, now() - interval '1 minute', 0)
 ORDER BY c.priority, c.run_at, c.id
 LIMIT 10
   FOR UPDATE SKIP LOCKED
$q$));
INSERT INTO plans VALUES ('reap', pg_temp.plan_of($q$
SELECT l.id, l.stage, l.attempt, l.rerun, l.worker, l.lease_expires
  FROM queue.live_tasks l
 WHERE l.status = 'running' AND l.lease_expires < now()
 ORDER BY l.lease_expires
 LIMIT 10000
   FOR UPDATE SKIP LOCKED
$q$));
-- PL/pgSQL may switch to a generic plan after a few calls: the claim must stay on the index
-- when stage, now and batch are unknown parameters too.
SET LOCAL plan_cache_mode = force_generic_plan;
INSERT INTO plans VALUES ('claim generic',
    pg_temp.plan_of($q$EXECUTE claim('plan.s1', now(), 10, -2147483648, '-infinity', 0)$q$));
INSERT INTO plans VALUES ('probe generic', pg_temp.plan_of($q$EXECUTE probe('plan.s1', now(), 1)$q$));
INSERT INTO plans VALUES ('claim update generic',
    pg_temp.plan_of($q$EXECUTE claim_update('plan.s1', now(), 10, interval '1 minute', 'w', -2147483648, '-infinity', 0)$q$));
INSERT INTO plans VALUES ('claim locked generic',
    pg_temp.plan_of($q$EXECUTE claim_locked('plan.s1', now(), 10, -2147483648, '-infinity', 0, '{1}')$q$));
-- reap_hung's stage filter (v_of: NULL on one server, a stage on Citus) as an unknown parameter.
INSERT INTO plans VALUES ('reap generic', pg_temp.plan_of($q$EXECUTE reap(now(), NULL)$q$));
RESET plan_cache_mode;

SELECT ok(pg_temp.uses_index(p.plan, 'live_tasks_claim'), 'the claim query uses index live_tasks_claim')
  FROM plans p WHERE p.name = 'claim';
SELECT ok(NOT pg_temp.has_node(p.plan, 'Seq Scan'), 'the claim query has no Seq Scan')
  FROM plans p WHERE p.name = 'claim';
SELECT ok(NOT pg_temp.has_node(p.plan, 'Sort'), 'the claim query has no Sort: the index gives the order')
  FROM plans p WHERE p.name = 'claim';
SELECT ok(pg_temp.uses_index(p.plan, 'live_tasks_claim')
          AND NOT pg_temp.has_node(p.plan, 'Seq Scan') AND NOT pg_temp.has_node(p.plan, 'Sort'),
          'the generic plan of the claim query uses live_tasks_claim, without Seq Scan or Sort')
  FROM plans p WHERE p.name = 'claim generic';
SELECT ok(pg_temp.uses_index(p.plan, 'live_tasks_claim')
          AND NOT pg_temp.has_node(p.plan, 'Seq Scan') AND NOT pg_temp.has_node(p.plan, 'Sort'),
          'the generic plan of the lower-priority probe uses live_tasks_claim, without Seq Scan or Sort (an EXISTS planned a Seq Scan)')
  FROM plans p WHERE p.name = 'probe generic';
SELECT ok(pg_temp.uses_index(p.plan, 'live_tasks_claim') AND pg_temp.uses_index(p.plan, 'live_tasks_pkey')
          AND NOT pg_temp.has_node(p.plan, 'Seq Scan') AND NOT pg_temp.has_node(p.plan, 'Hash Join'),
          'the generic plan of the whole claim statement finds the rows by live_tasks_claim and updates them by live_tasks_pkey, without Seq Scan or Hash Join')
  FROM plans p WHERE p.name = 'claim update generic';
SELECT ok(pg_temp.uses_index(p.plan, 'live_tasks_claim')
          AND NOT pg_temp.has_node(p.plan, 'Seq Scan') AND NOT pg_temp.has_node(p.plan, 'Sort'),
          'the generic plan of take_locked''s claim uses live_tasks_claim, without Seq Scan or Sort')
  FROM plans p WHERE p.name = 'claim locked generic';
SELECT ok(pg_temp.uses_index(p.plan, 'live_tasks_running'), 'reap_hung''s selection uses index live_tasks_running')
  FROM plans p WHERE p.name = 'reap';
SELECT ok(NOT pg_temp.has_node(p.plan, 'Seq Scan'), 'reap_hung''s selection has no Seq Scan')
  FROM plans p WHERE p.name = 'reap';
SELECT ok(pg_temp.uses_index(p.plan, 'live_tasks_running') AND NOT pg_temp.has_node(p.plan, 'Seq Scan'),
          'reap_hung''s selection, generic plan with its stage filter, uses index live_tasks_running and no Seq Scan')
  FROM plans p WHERE p.name = 'reap generic';

SELECT is(
    (SELECT pg_catalog.count(*)::integer FROM queue.take_next('plan.s1', batch => 10)), 10,
    'take_next itself claims 10 tasks from the backlog'
);

-- On failure, show the plans.
SELECT diag(p.name || ': ' || pg_catalog.jsonb_pretty(p.plan))
  FROM plans p
 WHERE NOT (pg_temp.uses_index(p.plan, CASE WHEN p.name = 'reap' THEN 'live_tasks_running' ELSE 'live_tasks_claim' END)
            AND NOT pg_temp.has_node(p.plan, 'Seq Scan')
            AND (p.name = 'reap' OR NOT pg_temp.has_node(p.plan, 'Sort')));

DEALLOCATE claim;
DEALLOCATE claim_update;
DEALLOCATE probe;
DEALLOCATE reap;

SELECT * FROM finish();
ROLLBACK;
