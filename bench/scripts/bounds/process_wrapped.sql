-- Bound, W2: bounds/process_history.sql's statements, each in a minimal SECURITY DEFINER function
-- (bounds/wrapped.sql): what the function calls alone cost, without what skiplock's functions
-- check. The same round trips as process_locked.sql. Variables: stage.
BEGIN;
SELECT coalesce((SELECT t.id FROM bounds.take(:stage) AS t), 0) AS id
\gset
\if :id = 0
ROLLBACK;
\sleep 10 ms
\else
\startpipeline
SELECT bounds.finish(:id, :stage);
COMMIT;
\endpipeline
\endif
