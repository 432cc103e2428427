-- A stage's task_timeout: set with configure_stage (0 removes it, '*' holds the default), read by
-- workers with queue.task_timeout(stage) and shown by queue.stage_config; bad values raise.
BEGIN;
SELECT plan(12);

SELECT is(queue.task_timeout('tt.a'), NULL::interval, 'a stage has no task_timeout by default');
SELECT is((queue.configure_stage('tt.a', task_timeout => interval '5 minutes')).task_timeout, interval '5 minutes',
          'configure_stage sets task_timeout');
SELECT is(queue.task_timeout('tt.a'), interval '5 minutes', 'task_timeout(stage) reads the stage''s own row');
SELECT is((queue.configure_stage('tt.a', max_attempts => 2)).task_timeout, interval '5 minutes',
          'a call that leaves task_timeout NULL keeps it');
SELECT lives_ok($$SELECT queue.configure_stage('*', task_timeout => interval '1 minute')$$, 'the defaults row takes one too');
SELECT is(queue.task_timeout('tt.b'), interval '1 minute', 'a stage without a row follows ''*''');
SELECT results_eq($$SELECT c.stage, c.task_timeout FROM queue.stage_config c WHERE c.stage IN ('tt.a', '*') ORDER BY 1$$,
                  $$VALUES ('*', interval '1 minute'), ('tt.a', interval '5 minutes')$$,
                  'stage_config shows the task_timeout in force');
SELECT is((queue.configure_stage('tt.a', task_timeout => interval '0')).task_timeout, NULL::interval,
          'task_timeout => 0 removes the limit');
SELECT throws_ok($$SELECT queue.configure_stage('tt.a', task_timeout => interval '-1 second')$$, '22023',
                 'invalid stage setting', 'a negative task_timeout raises 22023');
SELECT throws_ok($$SELECT queue.configure_stage('tt.a', task_timeout => interval '101 years')$$, '22023',
                 'invalid stage setting', 'a task_timeout over 100 years raises 22023');
SELECT throws_ok($$SELECT queue.task_timeout(NULL)$$, '22004', NULL, 'task_timeout(NULL) raises 22004');

SET LOCAL ROLE skiplock_worker;
SELECT is(queue.task_timeout('tt.b'), interval '1 minute', 'skiplock_worker may read a stage''s task_timeout');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
