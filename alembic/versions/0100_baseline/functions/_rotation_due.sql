-- _rotation_due(policy, now): whether maintain() should rotate: never rotated, rotate_every has
-- passed since last_rotated, or last_rotated lies in the future (the clock moved back, or a test
-- injected a later now), which would otherwise stop rotation until the clock caught up.
CREATE OR REPLACE FUNCTION queue._rotation_due(policy queue.history_policy, now timestamptz)
    RETURNS boolean
    LANGUAGE sql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT $1.last_rotated IS NULL
        OR $1.last_rotated > $2
        OR $1.last_rotated <= $2 - $1.rotate_every
$$;
COMMENT ON FUNCTION queue._rotation_due(queue.history_policy, timestamptz) IS 'Internal: whether maintain() is due to rotate history partitions under this policy at now (last_rotated NULL, older than rotate_every, or in the future).';
REVOKE ALL ON FUNCTION queue._rotation_due(queue.history_policy, timestamptz) FROM PUBLIC;
