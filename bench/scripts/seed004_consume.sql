-- Seed 004's consume, as its article runs it: a batch of a random tenant's tasks moved to its
-- history in one statement. Variables: batch.
\set uid random(1,1000)
select run_task(:uid,:batch);
