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
DECLARE
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN set_priority.id IS NULL THEN 'id'
                  WHEN set_priority.priority IS NULL THEN 'priority' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('set_priority', v_bad, pg_catalog.jsonb_build_object(
            'id', set_priority.id::text, 'priority', set_priority.priority::text));
    END IF;
    -- </arguments>
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
