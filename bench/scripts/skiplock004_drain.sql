-- Seed 004's consume on skiplock with drain: one consumer a tenant at a time, as the seed's
-- advisory lock per tenant (a tenant another client drains: nothing, this call counts 0).
-- Variables: batch.
\set uid random(1,1000)
SELECT count(*) FROM queue.drain('s004.' || :uid, :batch);
