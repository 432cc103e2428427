-- SQL tasks: enqueue_sql's arguments and the states its tasks go through (claim, record, cancel,
-- retry), who may enqueue them, and that no other path can change what they run or as whom.
-- run_sql_tasks itself commits, so it cannot run inside this transaction: tests/py/test_sql_tasks.py
-- drives it.
BEGIN;
SELECT plan(62);

CREATE ROLE skiplock_t_alice NOLOGIN IN ROLE skiplock_sql;
CREATE ROLE skiplock_t_bob NOLOGIN IN ROLE skiplock_sql;
CREATE ROLE skiplock_t_producer NOLOGIN IN ROLE skiplock_producer;
CREATE TEMP TABLE ids (name text PRIMARY KEY, id bigint);
GRANT ALL ON ids TO PUBLIC;

-- Who may enqueue.
SET ROLE skiplock_t_producer;
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT 1')$$, '42501', NULL, 'a producer outside skiplock_sql cannot enqueue SQL tasks');
RESET ROLE;

SET ROLE skiplock_t_alice;
-- Arguments.
SELECT throws_ok($$SELECT queue.enqueue_sql(NULL)$$, '22004', 'request must be an SQL statement', 'a NULL request is 22004');
SELECT throws_ok($$SELECT queue.enqueue_sql(' ; ')$$, '22023', 'request must be an SQL statement', 'an empty request is 22023');
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT 1', timeout => '0')$$, '22023', 'timeout must be positive', 'a timeout of 0 is 22023');
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT 1', max => 0)$$, '22023', 'max must be at least 1', 'max 0 is 22023');
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT 1', keep_history => NULL)$$, '22004', NULL, 'a NULL keep_history is 22004');
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT 1', stage => '*')$$, '22023', NULL, 'the defaults row ''*'' is no stage (22023)');
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT 1', repeat => '10 ms')$$, '22023', NULL, 'a repeat under 1 second is 22023, as for enqueue');
SELECT throws_ok(format('SELECT queue.enqueue_sql(%L)', 'SELECT ''' || repeat('x', 1048576) || ''''), '54000', NULL, 'a request over 1 MiB is 54000');
RESET ROLE;
-- Issue 54, item 4: a request read from a table column arrives compressed; the limit is its real size.
CREATE TEMP TABLE big_request AS SELECT 'SELECT ''' || repeat('skiplock ', 250000) || '''' AS r;
SELECT throws_ok($$SELECT queue.enqueue_sql(b.r) FROM big_request b WHERE pg_catalog.pg_column_size(b.r) < 1048576$$,
                 '54000', 'request too large', 'a 2.25 MB request stored compressed in a column is measured uncompressed: 54000');
SELECT is((SELECT count(*) FROM queue.live_tasks), 0::bigint, 'rejected calls wrote nothing');

-- What a task holds.
SET ROLE skiplock_t_alice;
INSERT INTO ids VALUES ('now', queue.enqueue_sql('SELECT now()'));
INSERT INTO ids VALUES ('later', queue.enqueue_sql('SELECT 2', stage => 'reports', run_at => now() + interval '5 minutes',
                                                     timeout => '30 seconds', priority => -3, keep_history => false));
INSERT INTO ids VALUES ('periodic', queue.enqueue_sql('SELECT 3', stage => 'reports', repeat => '5 minutes', drift => false));
RESET ROLE;
SELECT results_eq($$SELECT t.stage, t.status::text, t.run_as::text, t.payload - 'nonce', (t.payload ->> 'nonce')::uuid IS NOT NULL
                      FROM queue.live_tasks t JOIN ids USING (id) WHERE ids.name = 'now'$$,
                  $$VALUES ('sql', 'ready', 'skiplock_t_alice', '{"sql": "SELECT now()", "timeout": null, "keep_history": true}'::jsonb, true)$$,
                  'enqueue_sql: stage ''sql'' by default, ready, run as the caller, the request in the payload with a random nonce');
SELECT results_eq($$SELECT t.stage, t.priority, t.run_at > now(), t.payload - 'nonce' FROM queue.live_tasks t JOIN ids USING (id) WHERE ids.name = 'later'$$,
                  $$VALUES ('reports', -3, true, '{"sql": "SELECT 2", "timeout": "00:00:30", "keep_history": false}'::jsonb)$$,
                  'enqueue_sql keeps stage, priority, run_at, timeout and keep_history');
SELECT results_eq($$SELECT t.repeat, t.drift FROM queue.live_tasks t JOIN ids USING (id) WHERE ids.name = 'periodic'$$,
                  $$VALUES (interval '5 minutes', false)$$, 'enqueue_sql keeps repeat and drift');
SELECT is(run_as::text, 'skiplock_t_alice', 'queue.tasks shows run_as') FROM queue.tasks JOIN ids USING (id) WHERE ids.name = 'now';
SELECT is(run_as, NULL, 'an ordinary task has no run_as') FROM queue.live_tasks WHERE id = queue.enqueue('{}', 'plain');

SET ROLE skiplock_t_alice;
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT 1', stage => 'capped', max => 2)$$, '42501', NULL,
                 'enqueue_sql with max from a role outside skiplock_admin is 42501 (a stage''s cap is policy)');
RESET ROLE;
SELECT is(queue.enqueue_sql('SELECT 1', stage => 'capped', max => 2) IS NOT NULL, true, 'enqueue_sql with max from an admin');
SELECT is(max_running, 2, 'max sets the stage''s max_running') FROM queue.stage_settings WHERE stage = 'capped';

-- Keys: ignore, rerun, and whose key it is.
SET ROLE skiplock_t_alice;
INSERT INTO ids VALUES ('keyed', queue.enqueue_sql('SELECT ''v1''', stage => 'keys', key => 'k'));
SELECT is(queue.enqueue_sql('SELECT ''v2''', stage => 'keys', key => 'k'), id, 'mode ignore returns the existing task') FROM ids WHERE name = 'keyed';
RESET ROLE;
SELECT is(payload ->> 'sql', 'SELECT ''v1''', 'mode ignore leaves the request as it was') FROM queue.live_tasks JOIN ids USING (id) WHERE name = 'keyed';
SET ROLE skiplock_t_alice;
SELECT is(queue.enqueue_sql('SELECT ''v3''', stage => 'keys', key => 'k', mode => 'rerun'), id, 'mode rerun re-runs the same task') FROM ids WHERE name = 'keyed';
RESET ROLE;
SELECT results_eq($$SELECT payload ->> 'sql', run_as::text FROM queue.live_tasks JOIN ids USING (id) WHERE name = 'keyed'$$,
                  $$VALUES ('SELECT ''v3''', 'skiplock_t_alice')$$, 'mode rerun replaces the request and keeps the role');

SET ROLE skiplock_t_bob;
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT ''bob''', stage => 'keys', key => 'k', mode => 'rerun')$$, '42501', NULL,
                 'another role cannot re-run the task (it would run its SQL as alice)');
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT ''bob''', stage => 'keys', key => 'k')$$, '42501', NULL,
                 'another role cannot even take over the key with mode ignore');
RESET ROLE;
SELECT queue.enqueue('{"plain": true}', 'keys', key => 'plain-key');
SET ROLE skiplock_t_alice;
SELECT throws_ok($$SELECT queue.enqueue_sql('SELECT 1', stage => 'keys', key => 'plain-key', mode => 'rerun')$$, '42501', NULL,
                 'enqueue_sql cannot turn an ordinary task into an SQL task');
RESET ROLE;
SET ROLE skiplock_t_producer;
SELECT throws_ok($$SELECT queue.enqueue('{"sql": "SELECT pg_read_file(''/etc/passwd'')"}', 'keys', key => 'k', mode => 'rerun')$$, '42501',
                 'key k of stage keys belongs to an SQL task', 'a producer cannot replace an SQL task''s request with enqueue(mode rerun)');
SELECT is(queue.enqueue('{}', 'keys', key => 'k'), id, 'enqueue(mode ignore) on an SQL task''s key returns it unchanged') FROM ids WHERE name = 'keyed';
RESET ROLE;
SELECT results_eq($$SELECT payload ->> 'sql', run_as::text FROM queue.live_tasks JOIN ids USING (id) WHERE name = 'keyed'$$,
                  $$VALUES ('SELECT ''v3''', 'skiplock_t_alice')$$, 'after all that the task is alice''s, with her request');

-- The executor's steps: claim, record. An executor is a session of the enqueuing role itself.
SET ROLE skiplock_t_bob;
SELECT is((SELECT count(*) FROM queue._sql_claim('sql', 'pgtap')), 0::bigint, 'another role''s session (bob logged in as postgres here) claims none of alice''s tasks');
RESET ROLE;
SET SESSION AUTHORIZATION skiplock_t_bob;
SELECT is((SELECT count(*) FROM queue._sql_claim('sql', 'pgtap')), 0::bigint, 'bob''s own session claims none of alice''s tasks');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION skiplock_t_alice;
CREATE TEMP TABLE claimed AS SELECT * FROM queue._sql_claim('sql', 'pgtap');
RESET SESSION AUTHORIZATION;
SELECT results_eq($$SELECT c.id, c.request, c.timeout, c.attempt FROM claimed c$$,
                  $$SELECT id, 'SELECT now()', interval '5 minutes', 1 FROM ids WHERE name = 'now'$$,
                  'alice''s session claims her task: the request, the stage''s lease as the timeout, the attempt');
SELECT results_eq($$SELECT t.status::text, t.worker ~ ('^pgtap#' || pg_backend_pid() || '$'), t.lease_expires >= now() + interval '5 minutes 30 seconds'
                      FROM queue.live_tasks t JOIN claimed c USING (id)$$,
                  $$VALUES ('running', true, true)$$, 'the claimed task runs, its worker names the backend pid, its lease covers timeout + 30 s');
SET SESSION AUTHORIZATION skiplock_t_alice;
SELECT is(queue._sql_record(id, lease, '{"rows": [[1]]}'), true, '_sql_record with a result finishes the task') FROM claimed;
RESET SESSION AUTHORIZATION;
SELECT results_eq($$SELECT h.status::text, h.run_as::text, h.result, h.finished >= h.started FROM queue.history h JOIN claimed c USING (id)$$,
                  $$VALUES ('done', 'skiplock_t_alice', '{"rows": [[1]]}'::jsonb, true)$$, 'history keeps the role and the result');
SELECT is(result, '{"rows": [[1]]}'::jsonb, 'queue.tasks shows the result') FROM queue.tasks JOIN claimed USING (id);

-- keep_history => false: the run leaves no row.
UPDATE queue.live_tasks SET run_at = now() WHERE id = (SELECT id FROM ids WHERE name = 'later');
SET SESSION AUTHORIZATION skiplock_t_alice;
SELECT is(queue._sql_record(c.id, c.lease, '{}'), true, 'a keep_history => false task finishes') FROM queue._sql_claim('reports', 'pgtap') c;
RESET SESSION AUTHORIZATION;
SELECT is((SELECT count(*) FROM queue.tasks JOIN ids USING (id) WHERE name = 'later'), 0::bigint, 'and leaves no trace, live or in history');

-- Errors: fail() decides by the stage's policy; give_back releases.
SET ROLE skiplock_t_alice;
INSERT INTO ids VALUES ('bad', queue.enqueue_sql('SELECT 1/0', stage => 'errs'));
RESET ROLE;
SET SESSION AUTHORIZATION skiplock_t_alice;
SELECT is(queue._sql_record(c.id, c.lease, NULL, '22012: division by zero'), true, '_sql_record with an error fails the attempt') FROM queue._sql_claim('errs') c;
RESET SESSION AUTHORIZATION;
SELECT results_eq($$SELECT status::text, attempt, error_text, run_as::text FROM queue.live_tasks JOIN ids USING (id) WHERE name = 'bad'$$,
                  $$VALUES ('error', 1, '22012: division by zero', 'skiplock_t_alice')$$, 'the task waits for a retry with the error and its role');
UPDATE queue.live_tasks SET run_at = now() WHERE id = (SELECT id FROM ids WHERE name = 'bad');
SET SESSION AUTHORIZATION skiplock_t_alice;
SELECT is(queue._sql_record(c.id, c.lease, NULL, NULL, give_back => true), true, 'give_back hands the task back') FROM queue._sql_claim('errs') c;
RESET SESSION AUTHORIZATION;
SELECT results_eq($$SELECT status::text, attempt FROM queue.live_tasks JOIN ids USING (id) WHERE name = 'bad'$$,
                  $$VALUES ('error', 1)$$, 'a handed-back task does not count the attempt (release)');
SELECT queue.configure_stage('errs', max_attempts => 2);
UPDATE queue.live_tasks SET run_at = now() WHERE id = (SELECT id FROM ids WHERE name = 'bad');
SET SESSION AUTHORIZATION skiplock_t_alice;
SELECT is(queue._sql_record(c.id, c.lease, NULL, '22012: division by zero'), true, 'the last attempt fails') FROM queue._sql_claim('errs') c;
RESET SESSION AUTHORIZATION;
SELECT results_eq($$SELECT status::text, run_as::text FROM queue.history JOIN ids USING (id) WHERE name = 'bad'$$,
                  $$VALUES ('fatal', 'skiplock_t_alice')$$, 'out of attempts the task is fatal, its role kept in history');
SELECT lives_ok($$SELECT queue.retry(id) FROM ids WHERE name = 'bad'$$, 'an admin retries the fatal SQL task');
SELECT results_eq($$SELECT status::text, run_as::text, payload ->> 'sql' FROM queue.live_tasks JOIN ids USING (id) WHERE name = 'bad'$$,
                  $$VALUES ('ready', 'skiplock_t_alice', 'SELECT 1/0')$$, 'retry brings back the request and its role');
SELECT lives_ok($$SELECT queue.cancel(id) FROM ids WHERE name = 'bad'$$, 'an admin cancels it');
SELECT is(run_as::text, 'skiplock_t_alice', 'the cancelled row keeps its role') FROM queue.history JOIN ids USING (id) WHERE name = 'bad' AND status = 'cancelled';

-- An ordinary task in an SQL stage is not the executor's: it waits for an ordinary worker.
SELECT queue.enqueue('{"sql": "SELECT 1"}', 'sqlonly') AS plain_id \gset
SET SESSION AUTHORIZATION skiplock_t_alice;
SELECT is((SELECT count(*) FROM queue._sql_claim('sqlonly')), 0::bigint, '_sql_claim skips an ordinary task');
RESET SESSION AUTHORIZATION;
SELECT results_eq(format($$SELECT status::text, attempt FROM queue.live_tasks WHERE id = %s$$, :plain_id),
                  $$VALUES ('ready', 0)$$, 'and leaves it as it was');

-- The watchdog's list: the role's running SQL tasks past their timeout, with the executor's pid.
SET ROLE skiplock_t_alice;
INSERT INTO ids VALUES ('slow', queue.enqueue_sql('SELECT pg_sleep(60)', stage => 'slow', timeout => '1 second'));
RESET ROLE;
SET SESSION AUTHORIZATION skiplock_t_alice;
CREATE TEMP TABLE slow AS SELECT * FROM queue._sql_claim('slow', 'pgtap');
SELECT is_empty($$SELECT * FROM queue._sql_overdue()$$, 'a task within its timeout is not overdue');
RESET SESSION AUTHORIZATION;
UPDATE queue.live_tasks SET started = now() - interval '2 seconds', updated = now() - interval '10 seconds' WHERE id = (SELECT id FROM slow);
SET SESSION AUTHORIZATION skiplock_t_bob;
SELECT is_empty($$SELECT * FROM queue._sql_overdue()$$, 'another role''s watchdog does not see it');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION skiplock_t_alice;
SELECT results_eq($$SELECT id, pid FROM queue._sql_overdue()$$, $$SELECT id, pg_backend_pid() FROM slow$$,
                  'past its timeout it is listed with the pid of the backend that claimed it');
SELECT is_empty($$SELECT * FROM queue._sql_overdue()$$, 'and not again within 5 seconds (its cancel is under way)');
RESET SESSION AUTHORIZATION;

-- Ordinary takers leave SQL tasks alone: a worker would get another role's request as a payload,
-- and its finish would record a run that never happened.
SET ROLE skiplock_t_alice;
INSERT INTO ids VALUES ('mixed_sql', queue.enqueue_sql('SELECT 1', stage => 'mixed', priority => -1));
INSERT INTO ids VALUES ('grouped_sql', queue.enqueue_sql('SELECT 1', stage => 'mixed.grouped', priority => -1));
RESET ROLE;
INSERT INTO ids VALUES ('mixed_plain', queue.enqueue('{"plain": 1}', 'mixed'));
INSERT INTO ids VALUES ('mixed_plain2', queue.enqueue('{"plain": 2}', 'mixed'));
DO $$ BEGIN PERFORM queue.configure_stage('mixed.grouped', group_limit => 5); END $$;
INSERT INTO ids VALUES ('grouped_plain', queue.enqueue('{"plain": 3}', 'mixed.grouped', group_key => 'g'));
SELECT results_eq($$SELECT t.id FROM queue.take_next('mixed', 1) t$$,
                  $$SELECT id FROM ids WHERE name = 'mixed_plain'$$,
                  'take_next hands out the ordinary task behind an SQL task of a lower priority number, not the SQL task');
SELECT results_eq($$SELECT t.id FROM queue.take_locked('mixed', 5) t$$,
                  $$SELECT id FROM ids WHERE name = 'mixed_plain2'$$,
                  'take_locked leaves the SQL task alone too');
SELECT results_eq($$SELECT t.id FROM queue.take_next('mixed.grouped', 5) t$$,
                  $$SELECT id FROM ids WHERE name = 'grouped_plain'$$,
                  'so does take_next in a stage with group_limit');
SELECT results_eq($$SELECT t.status::text, t.attempt FROM queue.live_tasks t JOIN ids USING (id) WHERE ids.name IN ('mixed_sql', 'grouped_sql')$$,
                  $$VALUES ('ready', 0), ('ready', 0)$$, 'the SQL tasks still wait, untouched, for their role''s executor');
SET ROLE skiplock_t_alice;
SELECT throws_ok(format('SELECT queue.enqueue_sql(%L)', 'SELECT 1 --' || repeat('x', 1048565)), '54000', 'request too large',
                 'a request of exactly 1 MiB, over the limit once stored with its options, is "request too large", not enqueue''s payload error');
RESET ROLE;

-- Privileges: the executor's steps belong to skiplock_sql (a role runs its own tasks).
SELECT ok(NOT has_function_privilege('skiplock_worker', 'queue._sql_claim(text,text)', 'EXECUTE'), 'a worker cannot claim SQL tasks');
SELECT ok(NOT has_function_privilege('skiplock_producer', 'queue._sql_record(bigint,uuid,jsonb,text,boolean)', 'EXECUTE'), 'a producer cannot record results');
SELECT ok(NOT has_function_privilege('skiplock_t_producer', 'queue.run_sql_tasks(text,integer,text,integer)', 'EXECUTE'), 'a producer cannot run the executor');
SELECT ok(has_function_privilege('skiplock_sql', 'queue.run_sql_tasks(text,integer,text,integer)', 'EXECUTE'), 'skiplock_sql may CALL run_sql_tasks');

SELECT * FROM finish();
ROLLBACK;
