-- W2 (and the workers of W3, W4): take one task and finish it, a round trip (and a commit) each,
-- as a worker does. The LEFT JOIN returns one row even when the queue is empty; then the worker
-- waits a little, as a real one would before polling again. Variables: stage.
SELECT coalesce(t.id, 0) AS id,
       coalesce(t.lease, '00000000-0000-0000-0000-000000000000') AS lease
  FROM (VALUES (1)) AS one LEFT JOIN queue.take_next(:stage) AS t ON true
\gset
\if :id > 0
SELECT queue.finish(:id, :lease, stage => :stage);
\else
\sleep 10 ms
\endif
