-- Undo 0004: SQL tasks still live become ordinary tasks (their payload holds the request).
ALTER TABLE queue.live_tasks
    DROP COLUMN run_as;
-- The roles stay, and so does skiplock_admin's membership in skiplock_sql (roles belong
-- to the cluster; other databases may use them); what 0004 granted them in this schema goes.
REVOKE USAGE ON SCHEMA queue FROM skiplock_sql;
