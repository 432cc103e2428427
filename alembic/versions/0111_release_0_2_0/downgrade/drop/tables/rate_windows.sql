DROP TABLE IF EXISTS queue.rate_windows;
