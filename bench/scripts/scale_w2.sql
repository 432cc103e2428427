-- W2 at a steady backlog (bench/scale.py): take one task of a random stage by row lock, finish it,
-- and enqueue its replacement into the same stage in the same transaction, so that the live
-- backlog keeps its size however long the cell runs. The finish, the enqueue and the COMMIT go in
-- one round trip (as process_locked.sql). Variables: stages (the stages are s1 … s<stages>).
\set s random(1, :stages)
BEGIN;
SELECT coalesce((SELECT t.id FROM queue.take_locked('s' || :s::text) AS t), 0) AS id
\gset
\if :id = 0
ROLLBACK;
\sleep 10 ms
\else
\startpipeline
SELECT queue.finish_locked(:id, stage => 's' || :s::text);
SELECT queue.enqueue('{"doc": 42}', 's' || :s::text);
COMMIT;
\endpipeline
\endif
