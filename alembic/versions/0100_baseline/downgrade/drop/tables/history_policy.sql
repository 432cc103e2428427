DROP TABLE IF EXISTS queue.history_policy;
