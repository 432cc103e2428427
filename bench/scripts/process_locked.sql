-- W2 with take_locked: the worker runs each task inside one transaction that takes it by row lock
-- and finishes it (queue.take_locked, queue.finish_locked): two calls, one commit, nothing written
-- at the take. When nothing is due, wait a little, as a real worker would. Variables: stage.
BEGIN;
SELECT coalesce((SELECT t.id FROM queue.take_locked(:stage) AS t), 0) AS id
\gset
\if :id = 0
ROLLBACK;
\sleep 10 ms
\else
SELECT queue.finish_locked(:id) AS finished
\gset
COMMIT;
\endif
