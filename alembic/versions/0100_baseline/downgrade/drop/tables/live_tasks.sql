DROP TABLE IF EXISTS queue.live_tasks;
