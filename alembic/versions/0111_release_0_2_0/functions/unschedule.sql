-- unschedule(name): remove a named cron schedule; true when it removed one, false when no schedule
-- has the name (not an error, so that cleanup scripts can run twice). Tasks it already enqueued
-- stay queued. Raises 22004 for a NULL name.
-- Writes queue.schedules (deletes one row; waits for a fire_schedules() that is firing it).
CREATE OR REPLACE FUNCTION queue.unschedule(name text)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN unschedule.name IS NULL THEN 'name' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('unschedule', v_bad, pg_catalog.jsonb_build_object(
            'name', unschedule.name));
    END IF;
    -- </arguments>
    DELETE FROM queue.schedules s WHERE s.name = unschedule.name;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION queue.unschedule(text) IS 'Removes a named cron schedule: true when it did, false when no schedule has that name (idempotent). Tasks already enqueued stay. Raises 22004 for NULL. Writes queue.schedules.';
REVOKE ALL ON FUNCTION queue.unschedule(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.unschedule(text) TO skiplock_admin;
