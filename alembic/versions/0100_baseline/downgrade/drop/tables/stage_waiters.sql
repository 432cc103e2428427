DROP TABLE IF EXISTS queue.stage_waiters;
