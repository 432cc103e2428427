-- Schema queue holds every skiplock object; Alembic's version table queue.skiplock_version lives
-- here too, so skiplock's history never mixes with an application's own.
CREATE SCHEMA IF NOT EXISTS queue;
ALTER SCHEMA queue OWNER TO skiplock_owner;
REVOKE ALL ON SCHEMA queue FROM PUBLIC;
GRANT USAGE ON SCHEMA queue TO skiplock_producer, skiplock_worker, skiplock_monitor, skiplock_admin,
                               skiplock_sql;
COMMENT ON SCHEMA queue IS 'skiplock: a task queue in PL/pgSQL. Call its functions (\df+ queue.*), read its views (queue.tasks, queue.stats); never write its tables directly.';

-- Functions are executable by PUBLIC by default; skiplock grants each one to the roles that need it.
ALTER DEFAULT PRIVILEGES FOR ROLE skiplock_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
