-- W1 at scale (bench/scale.py): enqueue one task into a random stage per transaction.
-- Variables: stages (the stages are s1 … s<stages>).
\set s random(1, :stages)
SELECT queue.enqueue('{"doc": 42}', 's' || :s::text);
