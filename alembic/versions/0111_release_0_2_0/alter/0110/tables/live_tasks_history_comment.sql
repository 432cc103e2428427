-- The comment of live_tasks.history, in a file of its own (Citus: one command a query string).
COMMENT ON COLUMN queue.live_tasks.history IS 'The history its stage kept when it was enqueued (configure_stage(history => …)): NULL, all; ''failures'', only a fatal end; ''none'', no row (its end is counted in queue.finished_counts).';
