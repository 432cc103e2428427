-- Back to 0106: _live_row_ok's comment.
COMMENT ON FUNCTION queue._live_row_ok(queue.task_status_live, integer, uuid, timestamptz, timestamptz, boolean, interval, timestamptz, text) IS 'Internal: the invariants of a live task, checked by the CHECK live_tasks_valid of queue.live_tasks.';
