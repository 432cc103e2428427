DROP TABLE IF EXISTS queue.dependencies;
