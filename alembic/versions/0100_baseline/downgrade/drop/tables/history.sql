DROP TABLE IF EXISTS queue.history;
