-- queue._live_stages() and queue._history_stages() list each stage with rows once, in order,
-- whatever the rows a stage holds: a loose index scan whose batch of index entries grows while
-- most entries are new stages (to 4,096) and shrinks to 2 where stages hold many. Here: 5,000
-- stages of one row (batches grow past 4,096 entries and end inside the list), stages of 300 and
-- of 2 rows between them (batches shrink and end inside a stage), running rows only in some
-- stages (the second index: stages of running rows alone, and stages in both), and names that
-- sort apart from their numbers ('s10' before 's9'). Each list must equal SELECT DISTINCT.
BEGIN;
SELECT plan(7);

-- live: 5,000 stages 'sp<n>' of a waiting task each; 20 stages 'dn<n>' of 300; 100 'tw<n>' of 2
INSERT INTO queue.live_tasks (stage, run_at, payload)
SELECT 'sp' || g, now(), '{}'::jsonb FROM pg_catalog.generate_series(1, 5000) g
UNION ALL
SELECT 'dn' || (g % 20), now(), '{}' FROM pg_catalog.generate_series(1, 6000) g
UNION ALL
SELECT 'tw' || (g % 100), now(), '{}' FROM pg_catalog.generate_series(1, 200) g;
-- running rows: in 300 stages of their own ('rn<n>') and in every tenth 'sp' stage
INSERT INTO queue.live_tasks (stage, status, run_at, payload, attempt, lease, lease_expires, started)
SELECT s, 'running', now(), '{}', 1, gen_random_uuid(), now() + interval '1 minute', now()
  FROM (SELECT 'rn' || g AS s FROM pg_catalog.generate_series(1, 300) g
        UNION ALL SELECT 'sp' || g FROM pg_catalog.generate_series(10, 5000, 10) g) r;
-- history: the same shapes in its own names
INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished)
SELECT 7000000 + g, s, 'done', 0, now(), '{}', 1, now(), now(), now() - interval '1 second'
  FROM (SELECT g, CASE WHEN g <= 5000 THEN 'hs' || g WHEN g <= 11000 THEN 'hd' || (g % 20) ELSE 'ht' || (g % 100) END AS s
          FROM pg_catalog.generate_series(1, 11200) g) r;

SELECT is((SELECT pg_catalog.array_agg(s) FROM queue._live_stages() s),
          (SELECT pg_catalog.array_agg(DISTINCT stage ORDER BY stage) FROM queue.live_tasks WHERE status IN ('ready', 'error', 'running')),
          '_live_stages(): every stage of waiting or running rows, once, in order');
SELECT is((SELECT pg_catalog.count(*) FROM queue._live_stages() s WHERE s LIKE 'rn%'), 300::bigint,
          'stages with running rows alone are among them');
SELECT is((SELECT pg_catalog.array_agg(s) FROM queue._history_stages() s),
          (SELECT pg_catalog.array_agg(DISTINCT stage ORDER BY stage) FROM queue.history),
          '_history_stages(): every stage of history, once, in order');

-- Only dense stages: every batch shrinks to 2 entries and ends inside a stage.
DELETE FROM queue.live_tasks WHERE stage NOT LIKE 'dn%';
DELETE FROM queue.history WHERE stage NOT LIKE 'hd%';
SELECT is((SELECT pg_catalog.array_agg(s) FROM queue._live_stages() s),
          (SELECT pg_catalog.array_agg(DISTINCT stage ORDER BY stage) FROM queue.live_tasks),
          '_live_stages() of 20 stages of 300 tasks each');
SELECT is((SELECT pg_catalog.array_agg(s) FROM queue._history_stages() s),
          (SELECT pg_catalog.array_agg(DISTINCT stage ORDER BY stage) FROM queue.history),
          '_history_stages() of 20 stages of 300 runs each');

DELETE FROM queue.live_tasks;
SELECT is((SELECT pg_catalog.count(*) FROM queue._live_stages()), 0::bigint, 'an empty queue has no stage');

-- A task that waits for another is in neither index: its stage comes after the others.
SELECT queue.enqueue('{}', 'sl.first');
SELECT queue.enqueue('{}', 'sl.then', after => ARRAY[(SELECT id FROM queue.live_tasks WHERE stage = 'sl.first')]);
SELECT is((SELECT pg_catalog.array_agg(s) FROM queue._live_stages() s), ARRAY['sl.first', 'sl.then'],
          '_live_stages() lists the stage of a task that waits for another, after the indexes'' stages');

SELECT * FROM finish();
ROLLBACK;
