-- What waiting tasks wait for: one row per edge, from enqueue(after => …) until the awaited task
-- leaves queue.live_tasks (queue._end_waits deletes its rows then, and a waiting task's own rows
-- when it is cancelled). So the table holds only edges to live tasks: rotation and compaction of
-- history never touch it. The count a waiting task still waits for is on its own row
-- (live_tasks.waits), which serialises concurrent ends of its last awaited tasks.
CREATE TABLE queue.dependencies (
    task          bigint  NOT NULL,
    after         bigint  NOT NULL,
    run_if_failed boolean NOT NULL,
    CONSTRAINT dependencies_pkey PRIMARY KEY (task, after)
);

-- The end of an awaited task finds what waits for it.
CREATE INDEX dependencies_after ON queue.dependencies (after);

COMMENT ON TABLE queue.dependencies IS 'Edges of waiting tasks (enqueue(after => …)) to the live tasks they wait for. A row goes when the awaited task ends; queue.tasks shows them as waits_for.';
COMMENT ON COLUMN queue.dependencies.task IS 'The waiting task.';
COMMENT ON COLUMN queue.dependencies.after IS 'A live task it waits for.';
COMMENT ON COLUMN queue.dependencies.run_if_failed IS 'after_failed => ''run'': the waiting task still runs if this one ends fatal or cancelled; false (''cancel''): it is cancelled then.';
