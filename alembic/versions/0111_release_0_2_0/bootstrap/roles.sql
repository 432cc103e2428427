-- The roles skiplock grants to. Roles belong to the whole cluster, so they are created only when
-- missing and never dropped by a downgrade (another database may use them).
--   skiplock_owner     NOLOGIN, owns every object in schema queue; SECURITY DEFINER functions run as it
--   skiplock_producer  may enqueue
--   skiplock_worker    may take, heartbeat, finish and fail tasks
--   skiplock_monitor   may read the views
--   skiplock_admin     all of the above plus cancel, retry, reap, stage settings
--   skiplock_sql       may enqueue SQL tasks (enqueue_sql) and run its own (run_sql_tasks, logged
--                      in as itself: a task runs with the privileges of the role that enqueued it)
-- The migrating user may be a superuser and its search_path anyone's: every operator, function
-- and type here is schema-qualified and exact-typed (OPERATOR(pg_catalog.=) with casts).
DO $roles$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['skiplock_owner', 'skiplock_producer', 'skiplock_worker',
                                  'skiplock_monitor', 'skiplock_admin', 'skiplock_sql']
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) v_role::pg_catalog.name) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN'::pg_catalog.text, v_role);
        END IF;
    END LOOP;
    -- The migrating user creates objects as skiplock_owner, so it must be a member.
    IF NOT pg_catalog.pg_has_role(current_user, 'skiplock_owner'::pg_catalog.name, 'MEMBER'::pg_catalog.text) THEN
        EXECUTE pg_catalog.format('GRANT skiplock_owner TO %I'::pg_catalog.text, current_user);
    END IF;
    -- maintain() tells a snapshot held by another role's session from a running statement only
    -- when it sees that session's state (queue._compaction_due); a superuser may grant that.
    IF NOT pg_catalog.pg_has_role('skiplock_owner'::pg_catalog.name, 'pg_read_all_stats'::pg_catalog.name, 'MEMBER'::pg_catalog.text)
       AND (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
        GRANT pg_read_all_stats TO skiplock_owner;
    END IF;
END
$roles$;

GRANT skiplock_producer, skiplock_worker, skiplock_monitor, skiplock_sql TO skiplock_admin;
