DROP TABLE IF EXISTS queue.finished_dropped;
