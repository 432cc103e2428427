-- Back to 0109, which knows no 'waiting': the tasks that wait for others become ready (their
-- dependencies are dropped with queue.dependencies).
UPDATE queue.live_tasks t SET status = 'ready', waits = 0 WHERE t.waits > 0;
