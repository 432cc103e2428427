-- The roles skiplock grants to. Roles belong to the whole cluster, so they are created only when
-- missing and never dropped by a downgrade (another database may use them).
--   skiplock_owner     NOLOGIN, owns every object in schema queue; SECURITY DEFINER functions run as it
--   skiplock_producer  may enqueue
--   skiplock_worker    may take, heartbeat, finish and fail tasks
--   skiplock_monitor   may read the views
--   skiplock_admin     all of the above plus cancel, retry, reap, stage settings
--   skiplock_sql       may enqueue SQL tasks (enqueue_sql) and run its own (run_sql_tasks, logged
--                      in as itself: a task runs with the privileges of the role that enqueued it)
DO $roles$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['skiplock_owner', 'skiplock_producer', 'skiplock_worker',
                                  'skiplock_monitor', 'skiplock_admin', 'skiplock_sql']
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
        END IF;
    END LOOP;
    -- The migrating user creates objects as skiplock_owner, so it must be a member.
    IF NOT pg_catalog.pg_has_role(current_user, 'skiplock_owner', 'MEMBER') THEN
        EXECUTE format('GRANT skiplock_owner TO %I', current_user);
    END IF;
END
$roles$;

GRANT skiplock_producer, skiplock_worker, skiplock_monitor, skiplock_sql TO skiplock_admin;
