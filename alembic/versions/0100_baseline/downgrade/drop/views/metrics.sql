DROP VIEW IF EXISTS queue.metrics;
