-- take_next's claim position (setting skiplock.claim_hint): a session's next claim starts where
-- its last one ended, so it does not walk the index entries its earlier takes left behind. What
-- must still hold: a due task of a lower priority number is taken first; a task that lands behind
-- the position (here a release) is taken as soon as nothing past it is due, or once the position
-- is 5 s old; a hint that is garbage or names another stage is ignored. now() is fixed for the
-- transaction, so "5 s old" is written into the hint by hand.
BEGIN;
SELECT plan(26);

CREATE TEMP TABLE took (seq serial PRIMARY KEY, id bigint, lease uuid, g integer);
CREATE FUNCTION pg_temp.take(stage text) RETURNS integer LANGUAGE sql AS $$
    INSERT INTO took (id, lease, g)
    SELECT k.id, k.lease, (k.payload ->> 'g')::integer FROM queue.take_next(stage) k
    RETURNING g
$$;

-- Six tasks, due one second apart.
SELECT queue.enqueue(pg_catalog.jsonb_build_object('g', g), stage => 'hint',
                     run_at => now() - interval '1 minute' + g * interval '1 second')
  FROM pg_catalog.generate_series(1, 6) g;

SELECT is(pg_temp.take('hint'), 1, 'the first take of a session scans from the beginning: task 1');
SELECT ok(pg_catalog.current_setting('skiplock.claim_hint') LIKE
              '0/%/' || (SELECT t.id FROM took t WHERE t.g = 1) || '/%/hint',
          'the session remembers where that claim ended (priority/run_at/id/rescan time/stage)');
SELECT is(pg_temp.take('hint'), 2, 'the next take goes on from there: task 2');

-- A released task goes back to its place, behind the position.
SELECT ok(queue.release(t.id, t.lease), 'setup: task 1 released') FROM took t WHERE t.g = 1;
SELECT is(pg_temp.take('hint'), 3, 'with tasks due past the position, the take goes on: task 3 (task 1 waits)');

-- A lower priority number is never passed over.
SELECT queue.enqueue('{"g": 100}', stage => 'hint', priority => -1);
SELECT is(pg_temp.take('hint'), 100, 'a due task of a lower priority number is taken first');
SELECT is(pg_temp.take('hint'), 1,
          'after it, the claim starts over from the beginning of the stage: the released task 1');
SELECT is(pg_temp.take('hint'), 4, 'then on in order: task 4');

-- Behind the position again, and the position is 5 s old.
SELECT is(pg_temp.take('hint'), 5, 'task 5');
SELECT queue.release(t.id, t.lease) FROM took t WHERE t.g = 4;
SELECT pg_catalog.set_config('skiplock.claim_hint',
           pg_catalog.regexp_replace(pg_catalog.current_setting('skiplock.claim_hint'),
                                     '^([^/]*/[^/]*/[^/]*)/[^/]*/',
                                     '\1/' || ((EXTRACT(epoch FROM now()) - 1) * 1000000)::bigint || '/'),
           false);
SELECT is(pg_temp.take('hint'), 4, 'a position older than 5 s is not used: the released task 4 comes before task 6');

-- Nothing due past the position: the take looks from the beginning before it returns nothing.
SELECT is(pg_temp.take('hint'), 6, 'task 6');
SELECT queue.release(t.id, t.lease) FROM took t WHERE t.g = 5;
SELECT is(pg_temp.take('hint'), 5, 'nothing due past the position: the take starts over and finds the released task 5');

-- A hint that is not skiplock's own, or names another stage, is ignored. Each case below puts a
-- hint past a released task, so a hint wrongly used would skip that task.
SELECT queue.enqueue(pg_catalog.jsonb_build_object('g', g), stage => 'hint2',
                     run_at => now() - interval '2 minutes' + g * interval '1 second')
  FROM pg_catalog.generate_series(7, 11) g;
SELECT pg_catalog.set_config('skiplock.claim_hint', '0/x/1/2/hint2', false);
SELECT is(pg_temp.take('hint2'), 7, 'a malformed hint is ignored: the take starts from the beginning');
SELECT is(pg_temp.take('hint2'), 8, 'setup: task 8, the hint is past task 7');
SELECT queue.release(t.id, t.lease) FROM took t WHERE t.g = 7;
SELECT pg_catalog.set_config('skiplock.claim_hint',
           pg_catalog.regexp_replace(pg_catalog.current_setting('skiplock.claim_hint'), '/hint2$', '/hint'), false);
SELECT is(pg_temp.take('hint2'), 7, 'a hint of another stage is ignored');
SELECT is(pg_temp.take('hint2'), 9, 'setup: task 9, the hint is past task 7');
SELECT queue.release(t.id, t.lease) FROM took t WHERE t.g = 7 AND t.seq = (SELECT max(k.seq) FROM took k WHERE k.g = 7);
SELECT pg_catalog.set_config('skiplock.claim_hint',
           pg_catalog.regexp_replace(pg_catalog.current_setting('skiplock.claim_hint'), '/hint2$', '/x/hint2'), false);
SELECT is(pg_temp.take('hint2'), 7, 'a hint of a stage whose name ends in /<this stage> is ignored');
SELECT queue.release(t.id, t.lease) FROM took t WHERE t.g = 7 AND t.seq = (SELECT max(k.seq) FROM took k WHERE k.g = 7);
SELECT pg_catalog.set_config('skiplock.claim_hint', '9999999999/99999999999999999999/1/99999999999999999999/hint2', false);
SELECT is(pg_temp.take('hint2'), 7, 'a hint whose numbers do not fit is ignored, not an error');
SELECT queue.release(t.id, t.lease) FROM took t WHERE t.g = 7 AND t.seq = (SELECT max(k.seq) FROM took k WHERE k.g = 7);
SELECT pg_catalog.set_config('skiplock.claim_hint', '0/-999999999999999999/1/999999999999999999/hint2', false);
SELECT is(pg_temp.take('hint2'), 7, 'a hint whose run_at leaves timestamptz''s range is ignored, not an error');

-- A stage name may hold '/', the hint's separator.
SELECT queue.enqueue(pg_catalog.jsonb_build_object('g', g), stage => 'a/b',
                     run_at => now() - interval '1 minute' + g * interval '1 second')
  FROM pg_catalog.generate_series(20, 22) g;
SELECT is(pg_temp.take('a/b'), 20, 'a stage named a/b: task 20');
SELECT is(pg_temp.take('a/b'), 21, 'task 21');
SELECT queue.release(t.id, t.lease) FROM took t WHERE t.g = 20;
SELECT is(pg_temp.take('a/b'), 22, 'its hint is used: the take goes on past the released task 20');

-- The definition: queue._claim_position reads what the take wrote, queue._claim_hint writes it.
SELECT is((SELECT p.id FROM queue._claim_position('a/b') p), (SELECT t.id FROM took t WHERE t.g = 22),
          '_claim_position reads the position the last take left in its stage: after task 22');
SELECT ok((SELECT p IS NULL FROM queue._claim_position('a') p),
          'for another stage (a prefix of the one in the hint) it reads no position');
SELECT queue._claim_hint(t, ((pg_catalog.date_part('epoch', now()) + 5) * 1000000)::bigint::text, 'a/b')
  FROM queue.live_tasks t, took k WHERE k.g = 21 AND t.id = k.id;
SELECT ok((SELECT (p.priority, p.run_at, p.id) = (t.priority, t.run_at, t.id)
                FROM queue._claim_position('a/b') p, queue.live_tasks t, took k WHERE k.g = 21 AND t.id = k.id),
          '_claim_hint writes the position of a task, which _claim_position reads back');
SELECT pg_catalog.set_config('skiplock.claim_hint', '99999999999/1/1/99999999999999999/a/b', false);
SELECT ok((SELECT p IS NULL FROM queue._claim_position('a/b') p), 'a hint set by hand that does not read back whole is none');

SELECT * FROM finish();
ROLLBACK;
