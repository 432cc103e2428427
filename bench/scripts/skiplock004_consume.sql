-- Seed 004's consume on skiplock: consume a batch of a random tenant's stage (moved to history in
-- one statement, returned to the caller's transaction; counted here, as the seed returns nothing).
-- Variables: batch.
\set uid random(1,1000)
SELECT count(*) FROM queue.consume('s004.' || :uid, :batch);
