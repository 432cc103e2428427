-- Dependencies: enqueue(after => ids, after_failed) makes a task wait, as 'waiting', until every
-- task it waits for has ended; the end of the last one makes it ready in the same transaction,
-- whatever ended it (finish, finish_locked, finish_batch, consume, fail, reap_hung, cancel); a
-- fatal or cancelled one cancels it ('cancel', cascading) or not ('run'). Awaited tasks already in
-- history are resolved at enqueue time. Concurrent ends of the last two awaited tasks:
-- tests/py/test_dependencies.py; random interleavings: tests/py/test_model_based.py.
BEGIN;
SELECT plan(49);

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
GRANT ALL ON made TO PUBLIC;
-- A task's live status, or its final one.
CREATE FUNCTION pg_temp.st(name text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce((SELECT t.status::text FROM queue.live_tasks t JOIN made m ON m.id = t.id WHERE m.name = $1),
                    (SELECT h.status::text FROM queue.history h JOIN made m ON m.id = h.id WHERE m.name = $1
                      ORDER BY h.finished DESC LIMIT 1))
$$;
CREATE FUNCTION pg_temp.id(name text) RETURNS bigint LANGUAGE sql AS $$ SELECT m.id FROM made m WHERE m.name = $1 $$;
-- Take the task `name` from its stage and finish it (it must be the only due task there).
CREATE FUNCTION pg_temp.run(name text) RETURNS boolean LANGUAGE sql AS $$
    SELECT queue.finish(t.id, t.lease) FROM queue.take_next((SELECT l.stage FROM queue.live_tasks l WHERE l.id = pg_temp.id($1))) t
$$;

-- Arguments ----------------------------------------------------------------------------------------------
INSERT INTO made VALUES ('p', queue.enqueue('{}', 'dep.p'));
SELECT throws_ok(format('SELECT queue.enqueue(%L, %L, after => ARRAY[%s, NULL]::bigint[])', '{}', 'dep.c', pg_temp.id('p')),
                 '22004', 'after must not contain NULL', 'a NULL in after is 22004');
SELECT throws_ok($$SELECT queue.enqueue('{}', 'dep.c', after => '{}')$$, '22023', 'after out of range', 'an empty after is 22023');
SELECT throws_ok($$SELECT queue.enqueue('{}', 'dep.c', after => ARRAY(SELECT g FROM generate_series(1, 1001) g)::bigint[])$$,
                 '22023', 'after out of range', 'more than 1000 ids in after is 22023');
SELECT throws_ok(format('SELECT queue.enqueue(%L, %L, after => ARRAY[%s], after_failed => %L)', '{}', 'dep.c', pg_temp.id('p'), 'skip'),
                 '22023', 'unknown after_failed', 'an unknown after_failed is 22023');
SELECT throws_ok(format('SELECT queue.enqueue(%L, %L, after => ARRAY[%s], after_failed => NULL)', '{}', 'dep.c', pg_temp.id('p')),
                 '22023', 'unknown after_failed', 'a NULL after_failed is 22023');
SELECT throws_ok(format('SELECT queue.enqueue(%L, %L, after => ARRAY[%s], repeat => %L)', '{}', 'dep.c', pg_temp.id('p'), '1 hour'),
                 '22023', 'a task that waits cannot repeat or be re-run', 'after with repeat is 22023');
SELECT throws_ok(format('SELECT queue.enqueue(%L, %L, key => %L, mode => %L, after => ARRAY[%s])', '{}', 'dep.c', 'k', 'rerun', pg_temp.id('p')),
                 '22023', 'a task that waits cannot repeat or be re-run', 'after with mode rerun is 22023');
SELECT throws_ok(format('SELECT queue.enqueue(%L, %L, after => ARRAY[%s, %s])', '{}', 'dep.c', pg_temp.id('p'), pg_temp.id('p') + 1000000),
                 'P0002', 'task to wait for not found', 'an id neither live nor in history is P0002');
SELECT is((SELECT count(*) FROM queue.live_tasks), 1::bigint, 'refused calls wrote nothing');
SELECT is((SELECT waits FROM queue.live_tasks WHERE id = pg_temp.id('p')), 0, 'nor marked the awaited task');

-- Fan-in: c waits for a and b ------------------------------------------------------------------------------
INSERT INTO made VALUES ('a', queue.enqueue('{}', 'dep.a')), ('b', queue.enqueue('{}', 'dep.b'));
INSERT INTO made VALUES ('c', queue.enqueue('{"c": 1}', 'dep.c', after => ARRAY[pg_temp.id('b'), pg_temp.id('a'), pg_temp.id('a')]));
SELECT is(pg_temp.st('c'), 'waiting', 'a task with after waits');
SELECT is((SELECT waits_for FROM queue.tasks WHERE id = pg_temp.id('c')), ARRAY[pg_temp.id('a'), pg_temp.id('b')],
          'queue.tasks shows what it waits for, each id once');
SELECT is((SELECT waits FROM queue.live_tasks WHERE id = pg_temp.id('c')), 2, 'it counts two live tasks to wait for');
SELECT ok((SELECT bool_and(waits = -1) FROM queue.live_tasks WHERE id IN (pg_temp.id('a'), pg_temp.id('b'))), 'both are marked as awaited (waits -1)');
SELECT is((SELECT count(*)::integer FROM queue.take_next('dep.c')), 0, 'take_next never hands out a waiting task');
SELECT is((SELECT due FROM queue.stats WHERE stage = 'dep.c'), 0::bigint, 'queue.stats does not count it as due');
SELECT ok(pg_temp.run('a'), 'a finishes');
SELECT is(pg_temp.st('c'), 'waiting', 'c still waits for b');
SELECT is((SELECT waits_for FROM queue.tasks WHERE id = pg_temp.id('c')), ARRAY[pg_temp.id('b')], 'and shows only b now');
SELECT ok(pg_temp.run('b'), 'b finishes');
SELECT is(pg_temp.st('c'), 'ready', 'the end of the last one makes c ready');
SELECT is((SELECT waits_for FROM queue.tasks WHERE id = pg_temp.id('c')), NULL::bigint[], 'with nothing left to wait for');
SELECT is((SELECT t.payload FROM queue.take_next('dep.c') t), '{"c": 1}'::jsonb, 'and take_next hands it out');
SELECT is((SELECT count(*) FROM queue.dependencies), 0::bigint, 'no edge is left');

-- Fan-out, and an awaited task that moves on with next_stage ----------------------------------------------------
INSERT INTO made VALUES ('f', queue.enqueue('{}', 'dep.f'));
INSERT INTO made VALUES ('f1', queue.enqueue('{}', 'dep.f1', after => ARRAY[pg_temp.id('f')])),
                        ('f2', queue.enqueue('{}', 'dep.f2', after => ARRAY[pg_temp.id('f')]));
SELECT ok((SELECT queue.finish(t.id, t.lease, next_stage => 'dep.f.next') FROM queue.take_next('dep.f') t), 'f moves on to another stage');
SELECT is(pg_temp.st('f1') || pg_temp.st('f2'), 'waitingwaiting', 'a task that moved on has not ended: both still wait');
SELECT ok(pg_temp.run('f'), 'f finishes in its last stage');
SELECT is(pg_temp.st('f1') || pg_temp.st('f2'), 'readyready', 'its end makes every task that waited for it ready');

-- The other ends: finish_locked, finish_batch, consume ----------------------------------------------------------
INSERT INTO made VALUES ('l', queue.enqueue('{}', 'dep.l')), ('m', queue.enqueue('{}', 'dep.m')), ('n', queue.enqueue('{}', 'dep.n'));
INSERT INTO made VALUES ('lw', queue.enqueue('{}', 'dep.w', after => ARRAY[pg_temp.id('l')])),
                        ('mw', queue.enqueue('{}', 'dep.w', after => ARRAY[pg_temp.id('m')])),
                        ('nw', queue.enqueue('{}', 'dep.w', after => ARRAY[pg_temp.id('n')]));
SELECT ok((SELECT queue.finish_locked(t.id) FROM queue.take_locked('dep.l') t), 'finish_locked ends l');
SELECT ok((SELECT queue.finish_batch(array_agg(t.id), array_agg(t.lease)) = 1 FROM queue.take_next('dep.m') t), 'finish_batch ends m');
SELECT is((SELECT count(*)::integer FROM queue.consume('dep.n')), 1, 'consume ends n');
SELECT is(pg_temp.st('lw') || pg_temp.st('mw') || pg_temp.st('nw'), 'readyreadyready', 'each of them makes its waiting task ready');

-- Failures: 'cancel' (default) cascades, 'run' runs anyway ------------------------------------------------------
INSERT INTO made VALUES ('x', queue.enqueue('{}', 'dep.x'));
INSERT INTO made VALUES ('xc', queue.enqueue('{}', 'dep.y', after => ARRAY[pg_temp.id('x')])),
                        ('xr', queue.enqueue('{}', 'dep.y', after => ARRAY[pg_temp.id('x')], after_failed => 'run'));
INSERT INTO made VALUES ('xcc', queue.enqueue('{}', 'dep.y', after => ARRAY[pg_temp.id('xc')])),
                        ('xcr', queue.enqueue('{}', 'dep.y', after => ARRAY[pg_temp.id('xc')], after_failed => 'run'));
SELECT ok((SELECT queue.fail(t.id, t.lease, 'boom', fatal => true) FROM queue.take_next('dep.x') t), 'x fails for good');
SELECT is(pg_temp.st('xc'), 'cancelled', 'a task waiting with after_failed cancel is cancelled');
SELECT is((SELECT h.error_text FROM queue.history h WHERE h.id = pg_temp.id('xc')),
          format('task %s, which it waited for, ended fatal', pg_temp.id('x')), 'its error names the task and how it ended');
SELECT is(pg_temp.st('xr'), 'ready', 'a task waiting with after_failed run becomes ready');
SELECT is(pg_temp.st('xcc') || '/' || pg_temp.st('xcr'), 'cancelled/ready', 'the cancel cascades by each waiting task''s own policy');

-- reap_hung: an expired lease at the last attempt is fatal
INSERT INTO made VALUES ('r', queue.enqueue('{}', 'dep.r'));
INSERT INTO made VALUES ('rw', queue.enqueue('{}', 'dep.rw', after => ARRAY[pg_temp.id('r')]));
SELECT queue.configure_stage('dep.r', max_attempts => 1);
SELECT is((SELECT count(*)::integer FROM queue.take_next('dep.r')), 1, 'r is taken');
UPDATE queue.live_tasks SET lease_expires = now() - interval '1 second' WHERE id = pg_temp.id('r');
SELECT queue.reap_hung();
SELECT is(pg_temp.st('r') || '/' || pg_temp.st('rw'), 'fatal/cancelled', 'reap_hung''s fatal end cancels what waited for it');

-- cancel: of an awaited task, and of a waiting one
INSERT INTO made VALUES ('k', queue.enqueue('{}', 'dep.k'));
INSERT INTO made VALUES ('kw', queue.enqueue('{}', 'dep.kw', after => ARRAY[pg_temp.id('k')], after_failed => 'run')),
                        ('kx', queue.enqueue('{}', 'dep.kw', after => ARRAY[pg_temp.id('k')]));
SELECT queue.cancel(pg_temp.id('kx'));
SELECT is((SELECT count(*)::integer FROM queue.dependencies WHERE task = pg_temp.id('kx')), 0, 'a cancelled waiting task leaves no edge');
SELECT queue.cancel(pg_temp.id('k'));
SELECT is(pg_temp.st('kw'), 'ready', 'cancelling the awaited task releases a task waiting with after_failed run');

-- At enqueue: awaited tasks already in history --------------------------------------------------------------
INSERT INTO made VALUES ('hd', queue.enqueue('{}', 'dep.h', after => ARRAY[pg_temp.id('a'), pg_temp.id('b')]));
SELECT is(pg_temp.st('hd'), 'ready', 'tasks already done: ready at once');
INSERT INTO made VALUES ('hx', queue.enqueue('{}', 'dep.h', after => ARRAY[pg_temp.id('a'), pg_temp.id('x')]));
SELECT is(pg_temp.st('hx'), 'cancelled', 'one already fatal, after_failed cancel: recorded cancelled at once');
INSERT INTO made VALUES ('hr', queue.enqueue('{}', 'dep.h', after => ARRAY[pg_temp.id('x'), pg_temp.id('p')], after_failed => 'run'));
SELECT is(pg_temp.st('hr') || (SELECT waits FROM queue.live_tasks WHERE id = pg_temp.id('hr')), 'waiting1',
          'one already fatal, after_failed run, one live: it waits for the live one only');

-- A key: mode ignore returns the live task; a re-run by key keeps a waiting task waiting
INSERT INTO made VALUES ('ky', queue.enqueue('{"v": 1}', 'dep.key', key => 'k1', after => ARRAY[pg_temp.id('p')]));
SELECT is(queue.enqueue('{"v": 2}', 'dep.key', key => 'k1', after => ARRAY[pg_temp.id('p')]), pg_temp.id('ky'),
          'after with a key of a live task returns that task');
SELECT is(queue.enqueue('{"v": 3}', 'dep.key', key => 'k1', mode => 'rerun'), pg_temp.id('ky'), 'a re-run by key without after');
SELECT is((SELECT status::text || payload::text FROM queue.live_tasks WHERE id = pg_temp.id('ky')), 'waiting{"v": 3}',
          'takes the new payload and goes on waiting');

-- Who may: a producer enqueues with after; the edges table is no one's to read
SET ROLE skiplock_producer;
SELECT lives_ok(format('SELECT queue.enqueue(%L, %L, after => ARRAY[%s])', '{}', 'dep.prod', pg_temp.id('p')),
                'a producer may enqueue a task that waits');
SELECT throws_ok('SELECT count(*) FROM queue.dependencies', '42501', NULL, 'but not read queue.dependencies');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
