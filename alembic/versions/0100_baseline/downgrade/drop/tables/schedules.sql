DROP TABLE IF EXISTS queue.schedules;
