DROP VIEW IF EXISTS queue.errors;
