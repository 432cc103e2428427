-- take_locked's claim position (setting skiplock.claim_hint), the same rules as take_next's
-- (023_claim_hint.sql), which take_locked keeps as its own inline copy: a session's next claim
-- starts where its last one ended; a due task of a lower priority number is taken first; a task
-- that lands behind the position is taken once nothing past it is due, or once the position is
-- 5 s old; a hint that is garbage or names another stage is ignored. Each take here is finished
-- at once (a task this transaction holds would be taken again: its own lock does not stop it), and
-- tasks land behind the position by being enqueued with an earlier run_at.
BEGIN;
SELECT plan(17);

CREATE TEMP TABLE took (seq serial PRIMARY KEY, id bigint, g integer);
CREATE FUNCTION pg_temp.take(stage text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT k.id, (k.payload ->> 'g')::integer AS g INTO r FROM queue.take_locked(stage) k;
    IF r.id IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO took (id, g) VALUES (r.id, r.g);
    IF NOT queue.finish_locked(r.id) THEN
        RAISE EXCEPTION 'finish_locked refused task %', r.id;
    END IF;
    RETURN r.g;
END
$$;
CREATE FUNCTION pg_temp.behind(stage text, g integer) RETURNS void LANGUAGE sql AS $$
    SELECT queue.enqueue(pg_catalog.jsonb_build_object('g', g), stage => stage,
                         run_at => now() - interval '2 minutes' + g * interval '1 second');
$$;

-- Six tasks, due one second apart.
SELECT queue.enqueue(pg_catalog.jsonb_build_object('g', g), stage => 'lhint',
                     run_at => now() - interval '1 minute' + g * interval '1 second')
  FROM pg_catalog.generate_series(1, 6) g;

SELECT is(pg_temp.take('lhint'), 1, 'the first take of a session scans from the beginning: task 1');
SELECT ok(pg_catalog.current_setting('skiplock.claim_hint') LIKE
              '0/%/' || (SELECT t.id FROM took t WHERE t.g = 1) || '/%/lhint',
          'the session remembers where that claim ended (priority/run_at/id/rescan time/stage)');
SELECT is(pg_temp.take('lhint'), 2, 'the next take goes on from there: task 2');

SELECT pg_temp.behind('lhint', 50);
SELECT is(pg_temp.take('lhint'), 3, 'with tasks due past the position, the take goes on: task 3 (task 50, behind it, waits)');

-- A lower priority number is never passed over.
SELECT queue.enqueue('{"g": 100}', stage => 'lhint', priority => -1);
SELECT is(pg_temp.take('lhint'), 100, 'a due task of a lower priority number is taken first');
SELECT is(pg_temp.take('lhint'), 50, 'then the claim goes on from the beginning of the next priority: task 50');
SELECT is(pg_temp.take('lhint'), 4, 'then on in order: task 4');

-- Behind the position again, and the position is 5 s old.
SELECT pg_temp.behind('lhint', 51);
SELECT pg_catalog.set_config('skiplock.claim_hint',
           pg_catalog.regexp_replace(pg_catalog.current_setting('skiplock.claim_hint'),
                                     '^([^/]*/[^/]*/[^/]*)/[^/]*/',
                                     '\1/' || ((EXTRACT(epoch FROM now()) - 1) * 1000000)::bigint || '/'),
           false);
SELECT is(pg_temp.take('lhint'), 51, 'a position older than 5 s is not used: task 51 comes before task 5');

-- Nothing due past the position: the take looks from the beginning before it returns nothing.
SELECT is(pg_temp.take('lhint'), 5, 'task 5');
SELECT is(pg_temp.take('lhint'), 6, 'task 6');
SELECT pg_temp.behind('lhint', 52);
SELECT is(pg_temp.take('lhint'), 52, 'nothing due past the position: the take starts over and finds task 52');
SELECT is(pg_temp.take('lhint'), NULL, 'nothing due at all: nothing taken');

-- A hint that is not skiplock's own, or names another stage, is ignored. Each case puts a task
-- behind the position first, so a hint wrongly used would skip it.
SELECT queue.enqueue(pg_catalog.jsonb_build_object('g', g), stage => 'lhint2',
                     run_at => now() - interval '1 minute' + g * interval '1 second')
  FROM pg_catalog.generate_series(7, 9) g;
SELECT is(pg_temp.take('lhint2'), 7, 'setup: task 7, the hint is there');
SELECT pg_temp.behind('lhint2', 60);
SELECT pg_catalog.set_config('skiplock.claim_hint', '0/x/1/2/lhint2', false);
SELECT is(pg_temp.take('lhint2'), 60, 'a malformed hint is ignored: the take starts from the beginning');
SELECT is(pg_temp.take('lhint2'), 8, 'setup: task 8, the hint is there');
SELECT pg_temp.behind('lhint2', 61);
SELECT pg_catalog.set_config('skiplock.claim_hint',
           pg_catalog.regexp_replace(pg_catalog.current_setting('skiplock.claim_hint'), '/lhint2$', '/x/lhint2'), false);
SELECT is(pg_temp.take('lhint2'), 61, 'a hint of another stage (one whose name ends in /<this stage>) is ignored');
SELECT pg_temp.behind('lhint2', 62);
SELECT pg_catalog.set_config('skiplock.claim_hint', '9999999999/99999999999999999999/1/99999999999999999999/lhint2', false);
SELECT is(pg_temp.take('lhint2'), 62, 'a hint whose numbers do not fit is ignored, not an error');

SELECT * FROM finish();
ROLLBACK;
