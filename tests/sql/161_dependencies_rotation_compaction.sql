-- Dependencies across the two maintenance steps that rewrite or drop rows: compact() rewrites
-- queue.live_tasks (a waiting task keeps its count and edges, an awaited one its mark, and the
-- end of the last awaited task still makes it ready); rotate_partitions() drops history (a
-- waiting task is not touched, and a task whose history was rotated away can no longer be waited
-- for: P0002). The other ends: tests/sql/160_dependencies.sql; random interleavings with
-- retries, cancels and reap_hung: tests/py/test_model_based.py.
BEGIN;
SELECT plan(16);

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE FUNCTION pg_temp.id(name text) RETURNS bigint LANGUAGE sql AS $$ SELECT m.id FROM made m WHERE m.name = $1 $$;
CREATE FUNCTION pg_temp.st(name text) RETURNS text LANGUAGE sql AS $$
    SELECT t.status::text FROM queue.live_tasks t WHERE t.id = pg_temp.id($1)
$$;
-- Take the task `name` from its stage and finish it (it must be the only due task there).
CREATE FUNCTION pg_temp.run(name text) RETURNS boolean LANGUAGE sql AS $$
    SELECT queue.finish(t.id, t.lease) FROM queue.take_next((SELECT l.stage FROM queue.live_tasks l WHERE l.id = pg_temp.id($1))) t
$$;

-- compact(): the rewrite keeps what waits and what is awaited -----------------------------------------------
INSERT INTO made VALUES ('a', queue.enqueue('{}', 'depc.a')), ('b', queue.enqueue('{}', 'depc.b'));
INSERT INTO made VALUES ('c', queue.enqueue('{}', 'depc.c', after => ARRAY[pg_temp.id('a'), pg_temp.id('b')]));
SELECT ok(pg_temp.run('a'), 'a finishes before the rewrite');
-- Wait for the table first: compact() waits only 100 ms, and an autovacuum ANALYZE (every table of a
-- freshly upgraded database gets one) holds it longer; autovacuum gives way to a waiting LOCK.
LOCK TABLE queue.live_tasks IN ACCESS EXCLUSIVE MODE;
CREATE TEMP TABLE compacted AS SELECT * FROM queue.compact();  -- alone: TRUNCATE refuses a table this statement reads
SELECT is((SELECT tasks FROM compacted), (SELECT count(*) FROM queue.live_tasks), 'compact() rewrote the hot table');
SELECT is(pg_temp.st('c') || (SELECT waits FROM queue.live_tasks WHERE id = pg_temp.id('c')), 'waiting1',
          'after it, c still waits, for one task');
SELECT is((SELECT waits FROM queue.live_tasks WHERE id = pg_temp.id('b')), -1, 'b is still marked as awaited');
SELECT is((SELECT waits_for FROM queue.tasks WHERE id = pg_temp.id('c')), ARRAY[pg_temp.id('b')],
          'queue.tasks still shows what c waits for');
SELECT is((SELECT count(*)::integer FROM queue.take_next('depc.c')), 0, 'and no worker can take c');
SELECT ok(pg_temp.run('b'), 'b finishes after the rewrite');
SELECT is(pg_temp.st('c'), 'ready', 'its end makes c ready');
SELECT is((SELECT count(*) FROM queue.dependencies WHERE task = pg_temp.id('c')), 0::bigint, 'with no edge left');

-- rotate_partitions(): history dropped past the retention ---------------------------------------------------
DO $$
DECLARE
    v record;
BEGIN
    FOR v IN SELECT h.schema, h.name FROM queue._history_partitions() h LOOP
        EXECUTE format('DROP TABLE %I.%I', v.schema, v.name);
    END LOOP;
    TRUNCATE queue.history_default;
    UPDATE queue.history_policy
       SET partition_interval = '1 day', premake = 1, retention = '30 days', retention_action = 'drop',
           rotate_every = '10 minutes', last_rotated = NULL;
END
$$;
SELECT lives_ok('SELECT count(*) FROM queue.rotate_partitions()', 'setup: the partitions of today and tomorrow');
INSERT INTO made VALUES ('old', queue.enqueue('{}', 'depr.old')), ('p', queue.enqueue('{}', 'depr.p'));
INSERT INTO made VALUES ('w', queue.enqueue('{}', 'depr.w', after => ARRAY[pg_temp.id('p')]));
SELECT ok(pg_temp.run('old'), 'a task finishes into today''s partition');
SELECT ok((SELECT count(*) > 0 FROM queue.rotate_partitions(now() + interval '40 days') r WHERE r.action = 'dropped'),
          'forty days on, rotation drops today''s partition');
SELECT throws_ok(format('SELECT queue.enqueue(%L, %L, after => ARRAY[%s])', '{}', 'depr.late', pg_temp.id('old')),
                 'P0002', 'task to wait for not found', 'a task whose history was rotated away cannot be waited for: P0002');
SELECT is(pg_temp.st('w'), 'waiting', 'a task waiting meanwhile is untouched by rotation');
SELECT ok(pg_temp.run('p'), 'the task it waits for finishes');
SELECT is(pg_temp.st('w'), 'ready', 'and makes it ready');

SELECT * FROM finish();
ROLLBACK;
