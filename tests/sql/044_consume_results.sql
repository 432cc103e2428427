-- record_results: the results of the tasks this transaction consumed, kept in their history rows
-- and shown by queue.tasks; ids this transaction did not consume (finished in a savepoint, never
-- seen, another stage, already recorded) are skipped and counted out; every argument error.
-- (Other transactions' consumed runs, from two sessions: tests/py/test_consume.py.)
BEGIN;
SELECT plan(36);

CREATE FUNCTION pg_temp.error_fields(sql text) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE v_state text; v_message text; v_detail text; v_hint text;
BEGIN
    EXECUTE sql;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                            v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
    RETURN ARRAY[v_state, v_message, v_detail, v_hint];
END $$;

-- Consume, work, record: one transaction (this file's, at its top level) ---------------------------------------
SELECT queue.enqueue_batch(ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[], 'cr.a');
CREATE TEMP TABLE consumed AS SELECT c.id, c.payload FROM queue.consume('cr.a', 10) c;
SELECT is((SELECT count(*)::integer FROM consumed), 3, 'three tasks consumed');
SELECT is(queue.record_results('cr.a', ARRAY(SELECT id FROM consumed ORDER BY id),
                               ARRAY(SELECT jsonb_build_object('double', (payload ->> 'n')::integer * 2) FROM consumed ORDER BY id)),
          3, 'record_results after consume in the same transaction records the three and says so');
SELECT results_eq($$SELECT t.result FROM queue.tasks t JOIN consumed c USING (id) ORDER BY t.id$$,
                  $$VALUES ('{"double": 2}'::jsonb), ('{"double": 4}'), ('{"double": 6}')$$,
                  'queue.tasks shows each result');
SELECT results_eq($$SELECT h.status::text, h.attempt FROM queue.history h JOIN consumed c USING (id)$$,
                  $$VALUES ('done', 1), ('done', 1), ('done', 1)$$,
                  'the runs stay done, one history row each');
SELECT is(queue.record_results('cr.a', ARRAY(SELECT id FROM consumed), array_fill('{"again": 1}'::jsonb, ARRAY[3])),
          0, 'a second record of the same ids sets nothing (the results are set)');
SELECT is((SELECT count(*)::integer FROM queue.tasks t JOIN consumed c USING (id) WHERE t.result ? 'again'), 0,
          'and leaves the first results');

-- Ids this transaction did not consume ----------------------------------------------------------------------------
SELECT queue.enqueue_batch(ARRAY['{"n": 4}', '{"n": 5}']::jsonb[], 'cr.b');
CREATE TEMP TABLE b_ids AS SELECT c.id FROM queue.consume('cr.b', 10) c;
SELECT is(queue.record_results('cr.a', ARRAY(SELECT id FROM b_ids), array_fill('{"x": 1}'::jsonb, ARRAY[2])),
          0, 'ids consumed from another stage than the one named: nothing recorded');
SELECT is(queue.record_results('cr.b', ARRAY[-1, 9223372036854775807], array_fill('{"x": 1}'::jsonb, ARRAY[2])),
          0, 'ids never seen: nothing recorded');
-- A task taken and finished in a released savepoint: its done row carries the subtransaction's id.
SELECT queue.enqueue('{"n": 6}', 'cr.b') AS f1 \gset
SAVEPOINT earlier;
SELECT queue.finish(k.id, k.lease) FROM queue.take_next('cr.b') k;
RELEASE SAVEPOINT earlier;
SELECT is(queue.record_results('cr.b', ARRAY[:f1::bigint], ARRAY['{"x": 1}'::jsonb]), 0,
          'a task done by finish, not consumed by this transaction: nothing recorded');
-- consume inside a savepoint: rows of the subtransaction, not recorded (documented: consume at the top level).
SELECT queue.enqueue('{"n": 7}', 'cr.b') AS s1 \gset
SAVEPOINT inner_consume;
SELECT id FROM queue.consume('cr.b', 1);
RELEASE SAVEPOINT inner_consume;
SELECT is(queue.record_results('cr.b', ARRAY[:s1::bigint], ARRAY['{"x": 1}'::jsonb]), 0,
          'a task consumed inside a savepoint is not recorded');
SELECT is((SELECT count(*)::integer FROM queue.history WHERE stage = 'cr.b' AND result IS NOT NULL), 0,
          'none of those rows got a result');
-- Mixed: only the consumed ids count; a NULL result records nothing for its id.
SELECT is(queue.record_results('cr.b', ARRAY(SELECT id FROM b_ids ORDER BY id) || ARRAY[-1::bigint, :f1],
                               ARRAY['{"b": 1}', NULL, '{"b": 3}', '{"b": 4}']::jsonb[]),
          1, 'of four ids, the one consumed here with a result is recorded');
SELECT results_eq($$SELECT t.result FROM queue.tasks t JOIN b_ids USING (id) ORDER BY t.id$$,
                  $$VALUES ('{"b": 1}'::jsonb), (NULL)$$,
                  'the consumed id with a NULL result keeps none');
SELECT is(queue.record_results('cr.b', ARRAY(SELECT max(id) FROM b_ids), ARRAY['[1, 2]'::jsonb]), 1,
          'it can be recorded later in the transaction (a JSON array)');
SELECT is(queue.record_results('cr.b', '{}', '{}'), 0, 'empty arrays record nothing');
-- An id given twice gets its first result.
SELECT queue.enqueue('{"n": 10}', 'cr.t') AS t1 \gset
SELECT is(queue.record_results('cr.t', ARRAY(SELECT id FROM queue.consume('cr.t')) || ARRAY[:t1::bigint, :t1],
                               ARRAY[NULL, '{"first": 1}', '{"second": 2}']::jsonb[]), 1,
          'an id given three times is recorded once');
SELECT is((SELECT result FROM queue.tasks WHERE id = :t1), '{"first": 1}'::jsonb, 'with its first non-NULL result');
-- drain records its tasks as consume does: their results too.
SELECT queue.enqueue('{"n": 8}', 'cr.d') AS d1 \gset
SELECT is(queue.record_results('cr.d', ARRAY(SELECT id FROM queue.drain('cr.d', 5)), ARRAY['{"drained": 1}'::jsonb]), 1,
          'a drained task''s result is recorded');
SELECT is((SELECT result FROM queue.tasks WHERE id = :d1), '{"drained": 1}'::jsonb, 'and shown');

-- A stage that keeps no history of done runs has no row to record.
DO $$ BEGIN PERFORM queue.configure_stage('cr.n', history => 'none'); END $$;
SELECT queue.enqueue('{"n": 9}', 'cr.n') AS n1 \gset
SELECT is(queue.record_results('cr.n', ARRAY(SELECT id FROM queue.consume('cr.n')), ARRAY['{"lost": 1}'::jsonb]), 0,
          'history ''none'': nothing to record (0)');

-- Arguments ------------------------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT queue.record_results(NULL, '{1}', '{"{}"}')$$, '22004', NULL, 'a NULL stage raises 22004');
SELECT throws_ok($$SELECT queue.record_results('*', '{1}', '{"{}"}')$$, '22023', NULL, 'stage ''*'' raises 22023');
SELECT throws_ok(format($$SELECT queue.record_results(%L, '{1}', '{"{}"}')$$, repeat('s', 55)), '22023', NULL,
                 'a stage over 54 bytes raises 22023');
SELECT is(pg_temp.error_fields($$SELECT queue.record_results('cr.a', NULL, '{"{}"}')$$),
          ARRAY['22004', 'ids and results must not be NULL', 'record_results was called with ids NULL.',
                'Pass the ids consume returned and one result for each, in the same order.'],
          'NULL ids raise 22004 naming them');
SELECT is((pg_temp.error_fields($$SELECT queue.record_results('cr.a', NULL, NULL)$$))[3],
          'record_results was called with ids and results NULL.', 'both NULL: the DETAIL names both');
SELECT throws_ok($$SELECT queue.record_results('cr.a', '{1}', NULL)$$, '22004', 'ids and results must not be NULL',
                 'NULL results raise 22004');
SELECT is(pg_temp.error_fields($$SELECT queue.record_results('cr.a', '{1, 2}', '{"{}"}')$$),
          ARRAY['22023', 'ids and results must be arrays of the same length', '2 ids, 1 results.',
                'Pass one result per id, in the order of ids (NULL for a task without one).'],
          'arrays of unequal length raise 22023');
SELECT is(pg_temp.error_fields($$SELECT queue.record_results('cr.a', array_fill(1::bigint, ARRAY[10001]), array_fill('{}'::jsonb, ARRAY[10001]))$$),
          ARRAY['22023', 'batch out of range', '10001 tasks.', 'Record at most 10000 results per call.'],
          'more than 10000 ids raise 22023');
SELECT is(queue.record_results('cr.a', array_fill(-1::bigint, ARRAY[10000]), array_fill('{}'::jsonb, ARRAY[10000])), 0,
          '10000 ids are accepted');
SELECT is(pg_temp.error_fields($$SELECT queue.record_results('cr.a', '{1, 2}', ARRAY['{}', '42']::jsonb[])$$),
          ARRAY['22023', 'results[2] must be a JSON object or array', 'The results[2] is a JSON number.',
                'Wrap the value, e.g. {"value": 42}.'],
          'a JSON scalar result raises 22023 naming its place');
SELECT throws_ok($$SELECT queue.record_results('cr.a', '{1}', ARRAY['null'::jsonb])$$, '22023',
                 'results[1] must be a JSON object or array', 'a JSON null result raises 22023');
SELECT is((pg_temp.error_fields($$SELECT queue.record_results('cr.a', '{1}', ARRAY[jsonb_build_object('blob', repeat('x', 1100000))])$$))[1:2],
          ARRAY['54000', 'results[1] too large'], 'a result over 1 MiB raises 54000');
-- Compressed values are measured uncompressed: one stored compressed (200 MB of repeated text would
-- compress below 1 MiB; 2 MB shows the path).
CREATE TEMP TABLE big (v jsonb);
INSERT INTO big SELECT jsonb_build_object('blob', repeat('x', 2000000));
SELECT is((pg_temp.error_fields($$SELECT queue.record_results('cr.a', '{1}', ARRAY(SELECT v FROM big))$$))[1:2],
          ARRAY['54000', 'results[1] too large'], 'a compressed result over 1 MiB uncompressed raises 54000');
INSERT INTO big SELECT jsonb_build_object('small', repeat('y', 100000));
SELECT is(queue.record_results('cr.a', '{-1}', ARRAY(SELECT v FROM big WHERE v ? 'small')), 0,
          'a compressed result that fits is accepted');

-- A restricted stage: the take right -----------------------------------------------------------------------------
CREATE ROLE skiplock_t_results_worker NOLOGIN IN ROLE skiplock_worker;
SELECT lives_ok($$SELECT queue.grant_stage('cr.r', 'skiplock_admin')$$, 'cr.r is restricted to admins');
SET ROLE skiplock_t_results_worker;
SELECT is((pg_temp.error_fields($$SELECT queue.record_results('cr.r', '{1}', '{"{}"}')$$))[1:2],
          ARRAY['42501', 'permission denied for stage cr.r'],
          'a worker without the take right on a restricted stage gets 42501');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
