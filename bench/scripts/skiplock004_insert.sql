-- Seed 004's insert on skiplock: a stage per tenant, one enqueue for a random tenant of 1,000.
\set uid random(1,1000)
SELECT queue.enqueue('{"info": "test"}', 's004.' || :uid);
