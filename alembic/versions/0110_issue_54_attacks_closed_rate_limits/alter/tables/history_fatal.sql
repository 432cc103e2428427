-- The failed runs' partial index (queue.errors, the dashboard's failures page); built on every
-- partition of history, so it takes a while on a large history.
CREATE INDEX IF NOT EXISTS history_fatal ON queue.history (stage, finished) WHERE status = 'fatal';
