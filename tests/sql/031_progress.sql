-- heartbeat(…, progress): stores the latest progress on the running task (queue.live_tasks.progress,
-- shown by queue.tasks), replaced by each later one, kept by a heartbeat without progress and by a
-- failed attempt, cleared when the task moves to another stage or re-arms; a bad progress raises
-- and changes nothing; the calls without progress still work in every form.
BEGIN;
SELECT plan(15);

CREATE TEMP TABLE took AS SELECT k.id, k.lease FROM queue.take_next('prog.a') k WHERE false;
SELECT queue.enqueue('{}', 'prog.a');
INSERT INTO took SELECT k.id, k.lease FROM queue.take_next('prog.a') k;
CREATE FUNCTION pg_temp.progress() RETURNS jsonb LANGUAGE sql AS
    $$SELECT t.progress FROM queue.tasks t WHERE t.id = (SELECT id FROM took)$$;

SELECT is(pg_temp.progress(), NULL, 'a task has no progress until a worker reports one');
SELECT isnt((SELECT queue.heartbeat(id, lease, progress => '{"done": 10, "total": 100}') FROM took), NULL,
            'heartbeat with progress returns the new expiry');
SELECT is(pg_temp.progress(), '{"done": 10, "total": 100}'::jsonb, 'queue.tasks shows the progress');
SELECT queue.heartbeat(id, lease, stage => 'prog.a', progress => '{"done": 50, "total": 100}') FROM took;
SELECT is(pg_temp.progress(), '{"done": 50, "total": 100}'::jsonb, 'a later progress replaces it (stage given)');
SELECT queue.heartbeat(id, lease) FROM took;
SELECT queue.heartbeat(id, lease, interval '1 minute', 'prog.a') FROM took;
SELECT is(pg_temp.progress(), '{"done": 50, "total": 100}'::jsonb,
          'heartbeats without progress (two and four arguments, positional) keep it');

SELECT throws_ok(format($$SELECT queue.heartbeat(%s, %L, progress => '0.5')$$, id, lease),
                 '22023', 'progress must be a JSON object or array', 'a scalar progress raises 22023') FROM took;
SELECT throws_ok(format($$SELECT queue.heartbeat(%s, %L, progress => jsonb_build_object('blob', repeat('x', 1100000)))$$, id, lease),
                 '54000', 'progress too large', 'a progress over 1 MiB raises 54000') FROM took;
SELECT is(pg_temp.progress(), '{"done": 50, "total": 100}'::jsonb, 'a refused progress changes nothing');
SELECT throws_ok(format($$SELECT queue.heartbeat(%s, gen_random_uuid(), progress => '{"done": 99}')$$, id),
                 'SK001', 'lease lost', 'a stale lease with progress raises SK001') FROM took;

SELECT queue.fail(id, lease, 'boom', retry_in => interval '0') FROM took;
SELECT is(pg_temp.progress(), '{"done": 50, "total": 100}'::jsonb, 'a failed attempt''s progress stays visible');
DELETE FROM took;
INSERT INTO took SELECT k.id, k.lease FROM queue.take_next('prog.a') k;
SELECT queue.heartbeat(id, lease, progress => '[3]') FROM took;
SELECT is(pg_temp.progress(), '[3]'::jsonb, 'the next attempt reports its own');
SELECT queue.finish(id, lease, 'prog.b') FROM took;
SELECT is(pg_temp.progress(), NULL, 'moving to another stage clears it');
SELECT is((SELECT count(*)::integer FROM queue.tasks t WHERE t.id = (SELECT id FROM took) AND t.progress IS NOT NULL), 0,
          'finished rows of queue.tasks have no progress');

-- A periodic task's re-arm clears it: the next run starts without progress.
SELECT queue.enqueue('{}', 'prog.per', repeat => interval '1 hour');
DELETE FROM took;
INSERT INTO took SELECT k.id, k.lease FROM queue.take_next('prog.per') k;
SELECT queue.heartbeat(id, lease, progress => '{"done": 1}') FROM took;
SELECT is(pg_temp.progress(), '{"done": 1}'::jsonb, 'a periodic run reports progress');
SELECT queue.finish(id, lease) FROM took;
SELECT is((SELECT t.progress FROM queue.live_tasks t WHERE t.id = (SELECT id FROM took)), NULL,
          'its re-arm clears the progress for the next run');

SELECT * FROM finish();
ROLLBACK;
