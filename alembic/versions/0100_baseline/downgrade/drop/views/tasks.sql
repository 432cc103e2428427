DROP VIEW IF EXISTS queue.tasks;
