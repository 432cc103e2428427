-- Concurrency limits: stage_settings.max_running caps the running tasks of a stage, group_limit
-- the running tasks of one group_key. A group at its cap is skipped, never waited on; tasks
-- without a group count only against max_running; stages without limits take as before, without
-- the advisory lock. (Concurrent takers are tested in tests/py/test_limits_concurrent.py.)
BEGIN;
SELECT plan(38);

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (seq serial PRIMARY KEY, name text, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);

-- The advisory locks this session holds on skiplock's take key.
CREATE FUNCTION pg_temp.take_locks() RETURNS integer LANGUAGE sql AS $$
    SELECT count(*)::integer FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory' AND l.pid = pg_catalog.pg_backend_pid() AND l.classid = 1936419947 AND l.objsubid = 2
$$;
-- Running tasks of a stage, and the most running in any one group of it.
CREATE FUNCTION pg_temp.running(stage text) RETURNS integer LANGUAGE sql AS $$
    SELECT count(*)::integer FROM queue.live_tasks t WHERE t.stage = $1 AND t.status = 'running'
$$;
CREATE FUNCTION pg_temp.max_in_group(stage text) RETURNS integer LANGUAGE sql AS $$
    SELECT coalesce(max(n), 0)::integer
      FROM (SELECT count(*) AS n FROM queue.live_tasks t
             WHERE t.stage = $1 AND t.status = 'running' AND t.group_key IS NOT NULL GROUP BY t.group_key) g
$$;

-- A stage without limits: the plain claim, no lock ------------------------------------------------------------
INSERT INTO made SELECT 'u' || n, id FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[5]), 'lm.free', group_key => 'g')
                                          WITH ORDINALITY AS e(id, n);
SELECT is((SELECT count(*)::integer FROM queue.take_next('lm.free', batch => 5)), 5,
          'a stage without limits takes the whole batch, group_key or not');
SELECT is(pg_temp.take_locks(), 0, 'a take from a stage without limits takes no advisory lock');

-- max_running ---------------------------------------------------------------------------------------------------------
DO $$ BEGIN PERFORM queue.configure_stage('lm.max', max_running => 3); END $$;
INSERT INTO made SELECT 'm' || n, id FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[8]), 'lm.max') WITH ORDINALITY AS e(id, n);
INSERT INTO took (name, id, payload, attempt, lease, lease_expires, priority, key)
SELECT 'm-a', k.* FROM queue.take_next('lm.max', batch => 2) k;
SELECT is((SELECT count(*)::integer FROM took WHERE name = 'm-a'), 2, 'max_running 3: a batch of 2 is taken whole');
SELECT is(pg_temp.take_locks(), 1, 'a take from a limited stage holds the stage''s advisory lock until the transaction ends');
INSERT INTO took (name, id, payload, attempt, lease, lease_expires, priority, key)
SELECT 'm-b', k.* FROM queue.take_next('lm.max', batch => 5) k;
SELECT is((SELECT count(*)::integer FROM took WHERE name = 'm-b'), 1, 'max_running 3 with 2 running: a batch of 5 gets the 1 free place');
SELECT is_empty($$SELECT * FROM queue.take_next('lm.max', batch => 10)$$, 'max_running 3 with 3 running: nothing is taken');
SELECT results_eq(
    $$SELECT t.id FROM took t WHERE t.name LIKE 'm-%' ORDER BY t.id$$,
    $$SELECT m.id FROM made m WHERE m.name IN ('m1', 'm2', 'm3') ORDER BY m.id$$,
    'the capped takes still follow the claim order'
);
SELECT is(queue.finish(t.id, t.lease), true, 'one of the three finishes') FROM took t WHERE t.name = 'm-b';
SELECT is((SELECT count(*)::integer FROM queue.take_next('lm.max', batch => 10)), 1, 'a finish frees exactly one place');
SELECT is(queue.fail(t.id, t.lease, 'x', retry_in => interval '1 hour'), true, 'one fails and waits for its retry')
  FROM took t WHERE t.name = 'm-a' ORDER BY t.id LIMIT 1;
SELECT is((SELECT count(*)::integer FROM queue.take_next('lm.max', batch => 10)), 1, 'a task waiting for a retry does not count as running');
SELECT is(pg_temp.running('lm.max'), 3, 'the stage never had more than 3 running');
DO $$ BEGIN PERFORM queue.configure_stage('lm.max', max_running => 1); END $$;
SELECT is_empty($$SELECT * FROM queue.take_next('lm.max', batch => 10)$$,
                'a cap lowered below the running count takes nothing (running tasks are not stopped)');
DO $$ BEGIN PERFORM queue.configure_stage('lm.max', max_running => 0); END $$;
SELECT is((SELECT count(*)::integer FROM queue.take_next('lm.max', batch => 10)), 3, 'with the cap removed the rest is taken at once');

-- group_limit 1: one at a time per group, FIFO within it ----------------------------------------------------------
DO $$ BEGIN PERFORM queue.configure_stage('lm.grp', group_limit => 1); END $$;
-- Claim order is by priority, then run_at: a1 b1 a2 n1 c1 b2 a3 n2 (n: no group).
INSERT INTO made VALUES
    ('a1', queue.enqueue('{"n": "a1"}', 'lm.grp', priority => 1, group_key => 'A')),
    ('b1', queue.enqueue('{"n": "b1"}', 'lm.grp', priority => 2, group_key => 'B')),
    ('a2', queue.enqueue('{"n": "a2"}', 'lm.grp', priority => 3, group_key => 'A')),
    ('n1', queue.enqueue('{"n": "n1"}', 'lm.grp', priority => 4)),
    ('c1', queue.enqueue('{"n": "c1"}', 'lm.grp', priority => 5, group_key => 'C')),
    ('b2', queue.enqueue('{"n": "b2"}', 'lm.grp', priority => 6, group_key => 'B')),
    ('a3', queue.enqueue('{"n": "a3"}', 'lm.grp', priority => 7, group_key => 'A')),
    ('n2', queue.enqueue('{"n": "n2"}', 'lm.grp', priority => 8));
INSERT INTO took (name, id, payload, attempt, lease, lease_expires, priority, key)
SELECT 'g1', k.* FROM queue.take_next('lm.grp', batch => 3) k;
SELECT results_eq(
    $$SELECT m.name FROM took t JOIN made m ON m.id = t.id WHERE t.name = 'g1' ORDER BY t.priority$$,
    $$VALUES ('a1'), ('b1'), ('n1')$$,
    'group_limit 1, batch 3: the heads of A and B, then the ungrouped task; a2 behind a1 is skipped, not waited on'
);
INSERT INTO took (name, id, payload, attempt, lease, lease_expires, priority, key)
SELECT 'g2', k.* FROM queue.take_next('lm.grp', batch => 10) k;
SELECT results_eq(
    $$SELECT m.name FROM took t JOIN made m ON m.id = t.id WHERE t.name = 'g2' ORDER BY t.priority$$,
    $$VALUES ('c1'), ('n2')$$,
    'with A and B at their cap, a batch of 10 takes C''s head and the other ungrouped task, nothing of A or B'
);
SELECT is(pg_temp.max_in_group('lm.grp'), 1, 'no group has more than one task running');
SELECT is_empty($$SELECT * FROM queue.take_next('lm.grp', batch => 10)$$, 'every group at its cap and no ungrouped task left: nothing');
SELECT is(queue.finish(t.id, t.lease), true, 'a1 finishes') FROM took t JOIN made m ON m.id = t.id WHERE m.name = 'a1';
SELECT results_eq(
    $$SELECT m.name FROM queue.take_next('lm.grp', batch => 10) k JOIN made m ON m.id = k.id$$,
    $$VALUES ('a2')$$,
    'once a1 ended, A''s next task in order, a2, is taken, and only it'
);
SELECT is(queue.fail(l.id, l.lease, 'x', retry_in => interval '1 hour'), true, 'b1 fails and waits for a retry')
  FROM queue.live_tasks l JOIN made m ON m.id = l.id WHERE m.name = 'b1';
SELECT results_eq(
    $$SELECT m.name FROM queue.take_next('lm.grp', batch => 10) k JOIN made m ON m.id = k.id$$,
    $$VALUES ('b2')$$,
    'a group whose running task failed (retry later) has room again: its next due task, b2, is taken'
);

-- What a take in a limited stage records: lease_for and the worker name, as in any stage.
DO $$ BEGIN PERFORM queue.configure_stage('lm.rec', max_running => 5, group_limit => 2); END $$;
DO $$ BEGIN PERFORM queue.enqueue('{}', 'lm.rec', group_key => 'R'); PERFORM queue.enqueue('{}', 'lm.rec'); END $$;
INSERT INTO took (name, id, payload, attempt, lease, lease_expires, priority, key)
SELECT 'rec', k.* FROM queue.take_next('lm.rec', batch => 5, lease_for => interval '42 seconds', worker => 'w-rec') k;
SELECT results_eq(
    $$SELECT k.attempt, k.lease_expires, t.worker, t.started, t.lease = k.lease FROM took k JOIN queue.live_tasks t ON t.id = k.id
       WHERE k.name = 'rec' ORDER BY k.id$$,
    $$VALUES (1, now() + interval '42 seconds', 'w-rec'::text, now(), true), (1, now() + interval '42 seconds', 'w-rec', now(), true)$$,
    'a limited take starts attempt 1 with lease_for, the worker name and started, grouped or not, and returns the lease stored'
);
SELECT is((SELECT count(DISTINCT t.lease)::integer FROM queue.live_tasks t WHERE t.stage = 'lm.rec' AND t.status = 'running'), 2,
          'each task of a limited take gets its own lease');

-- A capped group's deep backlog never blocks others ----------------------------------------------------------------
DO $$ BEGIN PERFORM queue.configure_stage('lm.deep', group_limit => 1); END $$;
INSERT INTO made SELECT 'deep' || n, id
  FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2000]), 'lm.deep', priority => -1, group_key => 'big') WITH ORDINALITY AS e(id, n);
INSERT INTO made VALUES ('small1', queue.enqueue('{}', 'lm.deep', priority => 5, group_key => 'small')),
                        ('small2', queue.enqueue('{}', 'lm.deep', priority => 6, group_key => 'small')),
                        ('loose',  queue.enqueue('{}', 'lm.deep', priority => 7));
SELECT results_eq(
    $$SELECT m.name FROM queue.take_next('lm.deep', batch => 5) k JOIN made m ON m.id = k.id ORDER BY k.priority$$,
    $$VALUES ('deep1'), ('small1'), ('loose')$$,
    'batch 5 behind 2000 tasks of one group: its head, then the head of the small group and the ungrouped task'
);
SELECT is_empty(
    $$SELECT * FROM queue.take_next('lm.deep', batch => 1)$$,
    'with both groups at their cap and nothing else due, batch 1 takes nothing'
);
SELECT is(queue.finish(l.id, l.lease), true, 'small1 finishes') FROM queue.live_tasks l JOIN made m ON m.id = l.id WHERE m.name = 'small1';
SELECT results_eq(
    $$SELECT m.name FROM queue.take_next('lm.deep', batch => 1) k JOIN made m ON m.id = k.id$$,
    $$VALUES ('small2')$$,
    'batch 1: the 1999 waiting tasks of the capped group ahead of it do not block small2'
);

-- group_limit 2 and max_running together ----------------------------------------------------------------------------
DO $$ BEGIN PERFORM queue.configure_stage('lm.both', max_running => 4, group_limit => 2); END $$;
INSERT INTO made SELECT 'x' || n, id FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[4]), 'lm.both', priority => 1, group_key => 'X')
                                        WITH ORDINALITY AS e(id, n);
INSERT INTO made SELECT 'y' || n, id FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[4]), 'lm.both', priority => 2, group_key => 'Y')
                                        WITH ORDINALITY AS e(id, n);
INSERT INTO made SELECT 'z' || n, id FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[4]), 'lm.both', priority => 3, group_key => 'Z')
                                        WITH ORDINALITY AS e(id, n);
SELECT results_eq(
    $$SELECT m.name FROM queue.take_next('lm.both', batch => 3) k JOIN made m ON m.id = k.id ORDER BY k.id$$,
    $$VALUES ('x1'), ('x2'), ('y1')$$,
    'group_limit 2: two of X, in order, then Y''s head'
);
SELECT results_eq(
    $$SELECT m.name FROM queue.take_next('lm.both', batch => 10) k JOIN made m ON m.id = k.id ORDER BY k.id$$,
    $$VALUES ('y2')$$,
    'max_running 4 with 3 running: one more, Y''s second, though Z has room'
);
SELECT results_eq(
    $$SELECT pg_temp.running('lm.both'), pg_temp.max_in_group('lm.both')$$,
    $$VALUES (4, 2)$$,
    'the stage has 4 running, no group more than 2'
);
DO $$ BEGIN PERFORM queue.configure_stage('lm.both', max_running => 0); END $$;
SELECT results_eq(
    $$SELECT m.name FROM queue.take_next('lm.both', batch => 10) k JOIN made m ON m.id = k.id ORDER BY k.id$$,
    $$VALUES ('z1'), ('z2')$$,
    'without max_running, group_limit alone: Z fills its two places, X and Y stay at theirs'
);

-- The defaults row may carry a limit for every stage without a row of its own ----------------------------------------
DO $$ BEGIN PERFORM queue.configure_stage('*', max_running => 1); END $$;
INSERT INTO made SELECT 'dflt' || n, id FROM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[3]), 'lm.dflt') WITH ORDINALITY AS e(id, n);
SELECT is((SELECT count(*)::integer FROM queue.take_next('lm.dflt', batch => 3)), 1, 'a stage without a row is capped by the default max_running');
DO $$ BEGIN PERFORM queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2]), 'lm.max'); END $$;
SELECT is((SELECT count(*)::integer FROM queue.take_next('lm.max', batch => 10)), 2,
          'a stage with its own row keeps its own setting (no cap): both new tasks are taken');
DO $$ BEGIN PERFORM queue.configure_stage('*', max_running => 0); END $$;

-- Configuration errors ----------------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT queue.configure_stage('lm.err', max_running => -1)$$, '22023', 'invalid max_running',
                 'max_running below 0 raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('lm.err', group_limit => -3)$$, '22023', 'invalid group_limit',
                 'group_limit below 0 raises 22023');

-- A grouped take reads a tenant's backlog once, not once per pass: each pass starts after the
-- last one's candidates. Counted, not timed: the claim index entries this transaction read.
SELECT queue.configure_stage('lm.walk', group_limit => 1);
SELECT queue.enqueue_batch(pg_catalog.array_fill('{}'::jsonb, ARRAY[200]), 'lm.walk', group_key => 't' || g)
  FROM generate_series(1, 20) g;
ANALYZE queue.live_tasks;  -- as autovacuum would have: the plans of a table of 4,000 rows
CREATE TEMP TABLE walk_before AS
SELECT pg_stat_get_xact_tuples_returned('queue.live_tasks_claim'::regclass) AS idx_tup_read;
SELECT is((SELECT count(DISTINCT t.id)::int FROM queue.take_next('lm.walk', 20) t), 20,
          'a batch of 20 over 20 groups of 200 tasks (group_limit 1) takes the head of each');
SELECT cmp_ok((SELECT (pg_stat_get_xact_tuples_returned('queue.live_tasks_claim'::regclass) - b.idx_tup_read)::int
                 FROM walk_before b), '<', 8000,
              'it reads about the 4,000 entries of the backlog once, not again in each of its 20 passes (42,000)');

SELECT * FROM finish();
ROLLBACK;
