DROP VIEW IF EXISTS queue.hourly;
