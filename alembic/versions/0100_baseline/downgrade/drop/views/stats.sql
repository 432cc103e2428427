DROP VIEW IF EXISTS queue.stats;
