-- W2 with take_locked: the worker runs each task inside one transaction that takes it by row lock
-- and finishes it (queue.take_locked, queue.finish_locked): two calls, one commit, nothing written
-- at the take. The finish and the COMMIT go in one round trip (a pipeline), as a driver that does
-- not wait for the finish's answer sends them; an error in the finish skips the COMMIT. That makes
-- three round trips a task (the seed's loop needs two): BEGIN goes alone, because the take's answer
-- is needed before the finish and pgbench cannot \gset inside a pipeline. When nothing is due,
-- wait a little, as a real worker would. Variables: stage.
BEGIN;
SELECT coalesce((SELECT t.id FROM queue.take_locked(:stage) AS t), 0) AS id
\gset
\if :id = 0
ROLLBACK;
\sleep 10 ms
\else
\startpipeline
SELECT queue.finish_locked(:id, stage => :stage);
COMMIT;
\endpipeline
\endif
