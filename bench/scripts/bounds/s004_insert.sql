-- Bound, seed 004's insert: the INSERT enqueue runs into queue.live_tasks, for a random tenant's
-- stage of 1,000, with no function: the floor under skiplock004_insert.sql.
\set uid random(1,1000)
INSERT INTO queue.live_tasks (stage, payload) VALUES ('s004.' || :uid, '{"info": "test"}');
