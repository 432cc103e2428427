-- Finished runs that left queue.history: rotate_partitions() adds a partition's counts before it
-- drops, detaches or empties it, and retry() adds the run whose row it takes back to live. With
-- what history still holds, they make queue.finished_totals a count that only grows (a Prometheus
-- counter), without a write on the finish path. One row per stage and final status.
CREATE TABLE queue.finished_dropped (
    stage   text              NOT NULL,
    status  queue.task_status NOT NULL,
    total   bigint            NOT NULL,
    CONSTRAINT finished_dropped_pkey PRIMARY KEY (stage, status)
);

COMMENT ON TABLE queue.finished_dropped IS 'Finished runs no longer in queue.history (partitions dropped, detached or emptied by rotate_partitions; rows taken back by retry), per stage and status: the part of queue.finished_totals that history forgot.';
COMMENT ON COLUMN queue.finished_dropped.stage IS 'Stage.';
COMMENT ON COLUMN queue.finished_dropped.status IS 'Final status: done, fatal or cancelled.';
COMMENT ON COLUMN queue.finished_dropped.total IS 'Runs of the stage that reached the status and have left queue.history since install.';
