-- set_priority(id, priority): changes the priority of a waiting task, and take_next follows it;
-- unknown ids, finished tasks and a NULL priority raise, changing nothing.
BEGIN;
SELECT plan(15);

CREATE TEMP TABLE made (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE took (name text PRIMARY KEY, id bigint, payload jsonb, attempt integer, lease uuid,
                        lease_expires timestamptz, priority integer, key text);

-- Three tasks of equal priority: without a change they would be taken in id order (a, b, c).
INSERT INTO made VALUES ('a', queue.enqueue('{"n": 1}', 'sp'));
INSERT INTO made VALUES ('b', queue.enqueue('{"n": 2}', 'sp'));
INSERT INTO made VALUES ('c', queue.enqueue('{"n": 3}', 'sp'));

SELECT lives_ok(format('SELECT queue.set_priority(%s, -5)', id), 'set_priority of a waiting task succeeds')
  FROM made WHERE name = 'c';
SELECT lives_ok(format('SELECT queue.set_priority(%s, 10)', id), 'set_priority can also lower a task''s rank')
  FROM made WHERE name = 'a';
SELECT results_eq('SELECT priority FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''c'')',
                  'VALUES (-5)', 'the new priority is stored');
-- One task a call, so that the order of the claims is what is checked.
INSERT INTO took SELECT 'sp1', k.* FROM queue.take_next('sp') k;
INSERT INTO took SELECT 'sp2', k.* FROM queue.take_next('sp') k;
INSERT INTO took SELECT 'sp3', k.* FROM queue.take_next('sp') k;
SELECT results_eq('SELECT m.name FROM took t JOIN made m ON m.id = t.id WHERE t.name LIKE ''sp_'' ORDER BY t.name',
                  $$VALUES ('c'), ('b'), ('a')$$,
                  'take_next claims the tasks in the new priority order: raised first, lowered last');

INSERT INTO made VALUES ('x', queue.enqueue('{"n": 4}', 'sp.order'));
INSERT INTO made VALUES ('y', queue.enqueue('{"n": 5}', 'sp.order'));
SELECT lives_ok(format('SELECT queue.set_priority(%s, -1)', id), 'the later task is moved ahead') FROM made WHERE name = 'y';
INSERT INTO took SELECT 'first', k.* FROM queue.take_next('sp.order') k;
SELECT is((SELECT id FROM took WHERE name = 'first'), (SELECT id FROM made WHERE name = 'y'),
          'the task whose priority was raised is taken first');

-- A task waiting for its retry may be reprioritised too.
SELECT is(queue.fail(id, lease, 'x'), true, 'the first task failed') FROM took WHERE name = 'first';
SELECT lives_ok(format('SELECT queue.set_priority(%s, 3)', id), 'set_priority of an error task succeeds') FROM made WHERE name = 'y';
SELECT results_eq('SELECT status::text, priority FROM queue.live_tasks WHERE id = (SELECT id FROM made WHERE name = ''y'')',
                  $$VALUES ('error', 3)$$, 'an error task takes the new priority and keeps waiting for its retry');

-- Errors.
SELECT throws_ok('SELECT queue.set_priority(-1, 0)', 'P0002', 'task -1 not found', 'set_priority of an unknown id raises P0002');
INSERT INTO took SELECT 'done', k.* FROM queue.take_next('sp.order') k;
SELECT is(queue.finish(id, lease), true, 'the other task finished') FROM took WHERE name = 'done';
SELECT throws_ok(format('SELECT queue.set_priority(%s, 0)', id), '55000',
                 format('cannot change the priority of task %s: it is done', id),
                 'set_priority of a finished task raises 55000')
  FROM made WHERE name = 'x';
SELECT throws_ok(format('SELECT queue.set_priority(%s, NULL)', id), '22004', 'priority must not be NULL',
                 'set_priority with a NULL priority raises 22004')
  FROM made WHERE name = 'y';
SELECT throws_ok('SELECT queue.set_priority(NULL, 0)', '22004', 'id must not be NULL',
                 'set_priority of a NULL id raises 22004');
SELECT results_eq('SELECT priority FROM queue.tasks WHERE id IN (SELECT id FROM made WHERE name IN (''x'', ''y'')) ORDER BY id',
                  'VALUES (0), (3)', 'after the raising calls both priorities are unchanged');

SELECT * FROM finish();
ROLLBACK;
