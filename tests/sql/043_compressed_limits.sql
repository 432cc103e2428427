-- Issue 54, item 4, the rest of the class: every size limit bounds the size a reader gets, not the
-- stored (compressed) size. A value read from a table column arrives compressed, far under its
-- limit; 010_enqueue.sql, 011_enqueue_batch.sql and 150_sql_tasks.sql try the payload, a batch
-- element, the key and the SQL request. Here: a result (finish, finish_locked, finish_batch,
-- finish_and_take), a heartbeat's progress, a schedule's payload and an error text.
BEGIN;
SELECT plan(10);

CREATE TEMP TABLE big_values AS
SELECT pg_catalog.jsonb_build_object('blob', pg_catalog.repeat('skiplock ', 500000)) AS huge,     -- 4.5 MB
       pg_catalog.jsonb_build_object('blob', pg_catalog.repeat('skiplock ', 50000)) AS fine,      -- 450 kB
       pg_catalog.repeat('skiplock ', 20000) AS long_error;                                        -- 180,000 characters
SELECT ok((SELECT pg_catalog.pg_column_size(v.huge) < 1048576 AND pg_catalog.pg_column_compression(v.huge) IS NOT NULL
                  AND pg_catalog.pg_column_compression(v.long_error) IS NOT NULL
             FROM big_values v), 'the column holds the 4.5 MB value and the long error text compressed');

SELECT queue.enqueue('{}', 'cmp.a') FROM pg_catalog.generate_series(1, 3);
CREATE TEMP TABLE took AS SELECT k.id, k.lease FROM queue.take_next('cmp.a', 3) k;

SELECT throws_ok($$SELECT queue.finish(t.id, t.lease, result => v.huge) FROM took t, big_values v ORDER BY t.id LIMIT 1$$,
                 '54000', 'result too large', 'finish: a compressed result is measured uncompressed (54000)');
SELECT throws_ok($$SELECT queue.finish_batch(ARRAY[t.id], ARRAY[t.lease], result => ARRAY[v.huge])
                     FROM took t, big_values v ORDER BY t.id LIMIT 1$$,
                 '54000', 'result[1] too large', 'finish_batch: a compressed result element is measured uncompressed (54000)');
SELECT throws_ok($$SELECT f.* FROM (SELECT * FROM took ORDER BY id LIMIT 1) t, big_values v,
                            queue.finish_and_take(t.id, t.lease, 'cmp.a', finished_result => v.huge) f$$,
                 '54000', 'result too large', 'finish_and_take: a compressed result is measured uncompressed (54000)');
SELECT throws_ok($$SELECT queue.heartbeat(t.id, t.lease, progress => v.huge) FROM took t, big_values v ORDER BY t.id LIMIT 1$$,
                 '54000', 'progress too large', 'heartbeat: a compressed progress is measured uncompressed (54000)');
SELECT ok((SELECT queue.finish(t.id, t.lease, result => v.fine) FROM took t, big_values v ORDER BY t.id LIMIT 1),
          'a compressed result under 1 MiB uncompressed is accepted');
SELECT ok((SELECT queue.fail(t.id, t.lease, v.long_error) FROM took t, big_values v ORDER BY t.id DESC LIMIT 1),
          'fail with a compressed error text of 180,000 characters');
SELECT ok((SELECT pg_catalog.length(l.error_text) <= 2000 FROM queue.live_tasks l
            WHERE l.id = (SELECT max(t.id) FROM took t)),
          'the error text kept is cut to 2,000 characters, measured uncompressed');

SELECT queue.enqueue('{}', 'cmp.locked');
SELECT throws_ok($$SELECT queue.finish_locked(k.id, result => v.huge) FROM queue.take_locked('cmp.locked') k, big_values v$$,
                 '54000', 'result too large', 'finish_locked: a compressed result is measured uncompressed (54000)');
SELECT throws_ok($$SELECT queue.schedule('cmp.sched', '* * * * *', 'cmp.a', payload => v.huge) FROM big_values v$$,
                 '54000', 'payload too large', 'schedule: a compressed payload is measured uncompressed (54000)');

SELECT * FROM finish();
ROLLBACK;
