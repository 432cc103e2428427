-- set_priority(id, priority, stage): change the priority of a live task (lower runs first); takes
-- effect for its next take. Raises 22004 for a NULL id or priority, P0002 for an unknown id,
-- 55000 for a finished task. Not a change of state: `updated` stays (queue.errors reads it as
-- when an error task failed).
-- stage, when given, is the task's stage (routes the call on Citus); any other: P0002.
CREATE OR REPLACE FUNCTION queue.set_priority(id bigint, priority integer, stage text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF set_priority.id IS NULL THEN
        RAISE EXCEPTION 'id must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('set_priority was called with id NULL and priority %s.',
                                             coalesce(set_priority.priority::text, 'NULL')),
                  HINT = 'Pass the id of a task, e.g. from queue.tasks.';
    END IF;
    IF set_priority.priority IS NULL THEN
        RAISE EXCEPTION 'priority must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('set_priority was called with id %s and priority NULL.', set_priority.id),
                  HINT = 'Lower runs first; the default is 0.';
    END IF;
    UPDATE queue.live_tasks t
       SET priority = set_priority.priority
     WHERE t.id = set_priority.id AND (set_priority.stage IS NULL OR t.stage = set_priority.stage);
    IF NOT FOUND THEN
        PERFORM queue._raise_not_live(set_priority.id, 'change the priority of', set_priority.stage);
    END IF;
END
$$;
COMMENT ON FUNCTION queue.set_priority(bigint, integer, text) IS 'Changes the priority of a live task (lower runs first); not a change of state, so queue.errors.last_seen stays. Raises 22004 for a NULL id or priority, P0002 for an unknown id, 55000 for a finished one.';
REVOKE ALL ON FUNCTION queue.set_priority(bigint, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.set_priority(bigint, integer, text) TO skiplock_admin;
