-- A paused stage hands out nothing, whoever asks; other stages and the rest of the API go on.
BEGIN;
SELECT plan(8);

SELECT queue.enqueue('{"n": 1}', stage => 'paused.s') AS a \gset
SELECT queue.enqueue('{"n": 2}', stage => 'paused.other') AS b \gset

SELECT is((queue.configure_stage('paused.s', paused => true)).paused, true,
          'configure_stage(paused => true) records the pause');
SELECT is_empty($$SELECT * FROM queue.take_next('paused.s', batch => 10)$$,
                'take_next hands out nothing of a paused stage');
SELECT is((SELECT status::text FROM queue.tasks WHERE id = :a), 'ready',
          'the paused stage''s task stays ready');
SELECT is((SELECT count(*)::integer FROM queue.take_next('paused.other')), 1,
          'other stages are not paused');
SELECT lives_ok($$SELECT queue.enqueue('{"n": 3}', stage => 'paused.s')$$,
                'producers may enqueue into a paused stage');
SELECT is((queue.configure_stage('paused.s', max_attempts => 3)).paused, true,
          'changing another setting keeps the pause (NULL keeps a value)');
SELECT is((queue.configure_stage('paused.s', paused => false)).paused, false,
          'configure_stage(paused => false) resumes');
SELECT is((SELECT count(*)::integer FROM queue.take_next('paused.s', batch => 10)), 2,
          'after resuming, the waiting tasks are handed out');

SELECT * FROM finish();
ROLLBACK;
