DROP TABLE IF EXISTS queue.live_tasks;
DROP FUNCTION IF EXISTS queue._live_row_ok;
