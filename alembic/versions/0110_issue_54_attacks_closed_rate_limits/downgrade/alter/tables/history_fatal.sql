DROP INDEX IF EXISTS queue.history_fatal;
