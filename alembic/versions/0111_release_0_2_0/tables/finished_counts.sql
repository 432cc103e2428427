-- Finished runs of stages that keep no history of them (configure_stage(history => 'none' or
-- 'failures')): counted, not written one row a task. One row per stage, final status, minute and
-- backend, so that concurrent finishes never update the same row (no hot row); maintain() merges
-- each closed hour's rows into one (backend 0, minute the hour's start) and folds rows older than
-- queue.hourly's 7 days into queue.finished_dropped, so the table stays bounded.
CREATE TABLE queue.finished_counts (
    stage    text              NOT NULL,
    status   queue.task_status NOT NULL,
    minute   timestamptz       NOT NULL,
    backend  integer           NOT NULL,
    runs     bigint            NOT NULL,
    CONSTRAINT finished_counts_pkey PRIMARY KEY (stage, status, minute, backend)
)
-- A backend's row takes a new version a run: pages mostly empty are pruned of the old versions
-- after a few runs, so that each update walks a short chain.
WITH (fillfactor = 10);

COMMENT ON TABLE queue.finished_counts IS 'Finished runs not kept in queue.history (stages with history ''none'' or ''failures''), per stage, status, minute and backend; maintain() merges closed hours and moves rows older than 7 days to queue.finished_dropped.';
COMMENT ON COLUMN queue.finished_counts.stage IS 'Stage.';
COMMENT ON COLUMN queue.finished_counts.status IS 'Final status: done, fatal or cancelled.';
COMMENT ON COLUMN queue.finished_counts.minute IS 'The minute the runs finished in (the transaction''s start); for backend 0, the hour.';
COMMENT ON COLUMN queue.finished_counts.backend IS 'The counting backend''s process id, so that concurrent finishes write different rows; 0 once maintain() merged an hour.';
COMMENT ON COLUMN queue.finished_counts.runs IS 'Runs counted.';
