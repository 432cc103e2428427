-- queue.live_tasks loses its CHECK live_tasks_valid: PostgreSQL set it up again for every statement
-- that wrote a row (a fifth of an enqueue's instructions). Only the queue's functions write the
-- table; the test suite adds the CHECK to every database it tests. queue._live_row_ok stays.
-- Alone in its file: Citus sends a distributed table's ALTER to the shards as the file's text.
-- squawk-ignore ban-drop-constraint
ALTER TABLE queue.live_tasks DROP CONSTRAINT live_tasks_valid;
