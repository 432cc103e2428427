-- Seed 004's insert, as its article runs it: one task for a random tenant of 1,000.
\set uid random(1,1000)
select ins_task_init(:uid,'test',now()::timestamp);
