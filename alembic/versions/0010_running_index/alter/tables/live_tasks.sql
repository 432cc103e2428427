-- 0010: one index of running tasks instead of two. live_tasks_running serves the limited stages'
-- counts (stage, group_key) and reap_hung (lease_expires); every take wrote an entry into both old
-- ones.
--
-- Not CONCURRENTLY, on purpose: the upgrade is one transaction that already holds every queue
-- table in ACCESS EXCLUSIVE (alembic/env.py) so that the new take_next and the index it expects
-- arrive together, and CONCURRENTLY cannot run inside a transaction. The build reads the hot table
-- once: 45 ms for 300,000 live tasks (39 MB) on the 2-core CI machine, while workers wait.
-- squawk-ignore require-concurrent-index-creation
CREATE INDEX live_tasks_running ON queue.live_tasks (stage, group_key, lease_expires)
    WHERE status = 'running';
-- squawk-ignore require-concurrent-index-deletion
DROP INDEX queue.live_tasks_lease_expiry;
-- squawk-ignore require-concurrent-index-deletion
DROP INDEX queue.live_tasks_running_group;
