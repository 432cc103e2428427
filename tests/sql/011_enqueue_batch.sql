-- queue.enqueue_batch: ids in payload order, shared stage/priority/run_at, all or nothing, errors.
BEGIN;
SELECT plan(31);

CREATE TEMP TABLE batch AS
SELECT b.id, b.ord
  FROM queue.enqueue_batch(ARRAY['{"n": 1}', '{"n": 2}', '[3]', '{"n": 4}']::jsonb[],
                           stage => 'bulk', priority => 7,
                           run_at => now() + interval '5 minutes') WITH ORDINALITY AS b(id, ord);

SELECT is((SELECT pg_catalog.count(*)::integer FROM batch), 4, 'enqueue_batch returns one id per payload');

SELECT is((SELECT pg_catalog.count(DISTINCT b.id)::integer FROM batch b), 4, 'the ids are distinct');

SELECT results_eq(
    $$SELECT b.ord, t.payload FROM batch b JOIN queue.live_tasks t ON t.id = b.id ORDER BY b.ord$$,
    $$VALUES (1::bigint, '{"n": 1}'::jsonb), (2, '{"n": 2}'), (3, '[3]'), (4, '{"n": 4}')$$,
    'the ids come back in the order of the payloads (the i-th id is the task of payloads[i])'
);

SELECT ok((SELECT pg_catalog.bool_and(b.id < b2.id) FROM batch b JOIN batch b2 ON b2.ord = b.ord + 1),
          'ids increase with the payload order');

SELECT results_eq(
    $$SELECT DISTINCT t.stage, t.priority, t.run_at, t.status::text, t.attempt, t.key, t.created
        FROM batch b JOIN queue.live_tasks t ON t.id = b.id$$,
    $$VALUES ('bulk'::text, 7, now() + interval '5 minutes', 'ready'::text, 0, NULL::text, now())$$,
    'every task of the batch has the given stage, priority and run_at, is ready at attempt 0, without key'
);
SELECT results_eq(
    $$SELECT DISTINCT t.group_key, t.repeat FROM batch b JOIN queue.live_tasks t ON t.id = b.id$$,
    $$VALUES (NULL::text, NULL::interval)$$,
    'without group_key the tasks of a batch have no group; batches are never periodic'
);

CREATE TEMP TABLE grouped AS
SELECT b.id FROM queue.enqueue_batch(ARRAY['{}', '{}', '{}']::jsonb[], stage => 'bulk.g', group_key => 'tenant-7') AS b(id);
SELECT results_eq(
    $$SELECT t.group_key, pg_catalog.count(*)::integer FROM grouped b JOIN queue.live_tasks t ON t.id = b.id GROUP BY t.group_key$$,
    $$VALUES ('tenant-7'::text, 3)$$,
    'group_key => ''tenant-7'' gives every task of the batch that group'
);

CREATE TEMP TABLE defaults AS SELECT b.id FROM queue.enqueue_batch(ARRAY['{}', '{}']::jsonb[]) AS b(id);
SELECT results_eq(
    $$SELECT DISTINCT t.stage, t.priority, t.run_at
        FROM defaults b JOIN queue.live_tasks t ON t.id = b.id$$,
    $$VALUES ('default'::text, 0, now())$$,
    'defaults: stage ''default'', priority 0, run_at now()'
);

SELECT is_empty($$SELECT * FROM queue.enqueue_batch('{}'::jsonb[], stage => 'empty')$$,
                'an empty array returns no rows');
SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.live_tasks t WHERE t.stage = 'empty'), 0,
          'an empty array adds no task');

SET LOCAL ROLE skiplock_producer;
SELECT lives_ok($$SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], stage => 'roles')$$,
                'skiplock_producer may enqueue_batch');
RESET ROLE;
SET LOCAL ROLE skiplock_monitor;
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], stage => 'roles')$$,
                 '42501', 'permission denied for function enqueue_batch',
                 'skiplock_monitor may not enqueue_batch (42501)');
RESET ROLE;

-- Errors: all or nothing. Each raises its SQLSTATE, names the bad element and inserts nothing. ---
CREATE TEMP TABLE before_errors AS
SELECT pg_catalog.count(*) AS n, pg_catalog.md5(pg_catalog.string_agg(t::text, '|' ORDER BY t.id)) AS digest
  FROM queue.live_tasks t;

SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}', '{}', '42', '{}']::jsonb[], stage => 'bad')$$,
                 '22023', 'payloads[3]: payload must be a JSON object or array',
                 'a scalar element rejects the batch with 22023 and names payloads[3]');
CREATE FUNCTION pg_temp.detail_of(q text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE d text;
BEGIN
    EXECUTE q;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
    RETURN d;
END $f$;
SELECT is(pg_temp.detail_of($$SELECT queue.enqueue_batch(ARRAY['{}', '{}', '42', '{}']::jsonb[], stage => 'bad')$$),
          'Element 3 of the array. The payload is a JSON number.',
          'the element''s own DETAIL comes with its position');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}', NULL]::jsonb[], stage => 'bad')$$,
                 '22004', 'payloads[2]: payload must not be NULL',
                 'a NULL element rejects the batch with 22004 and names payloads[2]');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['"a"', 'true']::jsonb[], stage => 'bad')$$,
                 '22023', 'payloads[1]: payload must be a JSON object or array',
                 'with several bad elements the first is named');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}'::jsonb, '{}'::jsonb,
                                                    pg_catalog.jsonb_build_object('blob', pg_catalog.repeat('x', 1100000))],
                                              stage => 'bad')$$,
                 '54000', 'payloads[3]: payload too large',
                 'an element over 1 MiB rejects the batch with 54000 and names payloads[3]');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY(SELECT c.p FROM (SELECT pg_catalog.jsonb_build_object('blob', pg_catalog.repeat('skiplock ', 500000)) AS p) c), stage => 'bad')$$,
                 '54000', 'payloads[1]: payload too large',
                 'an element of 4.5 MB of repeated text (compressed, read from a column) is measured uncompressed');
SELECT throws_ok($$SELECT queue.enqueue_batch(NULL, stage => 'bad')$$,
                 '22023', 'payloads must be an array of at most 100000 payloads',
                 'a NULL array raises 22023');
SELECT throws_ok($$SELECT queue.enqueue_batch(pg_catalog.array_fill('{}'::jsonb, ARRAY[100001]), stage => 'bad')$$,
                 '22023', 'payloads must be an array of at most 100000 payloads',
                 'an array of 100001 payloads raises 22023');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], stage => 'bad', priority => NULL)$$,
                 '22004', 'priority must not be NULL', 'a NULL priority raises 22004');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], stage => NULL)$$,
                 '22004', 'stage must not be NULL', 'a NULL stage raises 22004');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], stage => '')$$,
                 '22023', 'invalid stage name', 'an empty stage raises 22023');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], stage => '*')$$,
                 '22023', 'invalid stage name', 'stage ''*'' raises 22023');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], stage => pg_catalog.repeat('s', 55))$$,
                 '22023', 'invalid stage name', 'a 55-byte stage raises 22023');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], stage => 'bad', group_key => '')$$,
                 '22023', 'invalid group_key', 'an empty group_key raises 22023');
SELECT throws_ok($$SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], stage => 'bad', group_key => pg_catalog.repeat('g', 201))$$,
                 '22023', 'invalid group_key', 'a group_key of 201 characters raises 22023');

SELECT results_eq(
    $$SELECT pg_catalog.count(*), pg_catalog.md5(pg_catalog.string_agg(t::text, '|' ORDER BY t.id)) FROM queue.live_tasks t$$,
    $$SELECT n, digest FROM before_errors$$,
    'the rejected batches inserted nothing: queue.live_tasks is exactly as it was'
);
SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.live_tasks t WHERE t.stage = 'bad'), 0,
          'no task of a rejected batch exists');

-- The largest batch allowed ------------------------------------------------------------------------
SELECT is((SELECT pg_catalog.count(*)::integer
             FROM queue.enqueue_batch(pg_catalog.array_fill('{}'::jsonb, ARRAY[100000]), stage => 'max')),
          100000, 'a batch of 100000 payloads is accepted and returns 100000 ids');
SELECT is((SELECT pg_catalog.count(*)::integer FROM queue.live_tasks t WHERE t.stage = 'max'), 100000,
          'a batch of 100000 payloads adds 100000 tasks');

SELECT * FROM finish();
ROLLBACK;
