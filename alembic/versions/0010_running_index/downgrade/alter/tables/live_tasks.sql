-- 0010 down: the two indexes of running tasks again.
CREATE INDEX live_tasks_lease_expiry ON queue.live_tasks (lease_expires)
    WHERE status = 'running';
CREATE INDEX live_tasks_running_group ON queue.live_tasks (stage, group_key)
    WHERE status = 'running';
DROP INDEX queue.live_tasks_running;
