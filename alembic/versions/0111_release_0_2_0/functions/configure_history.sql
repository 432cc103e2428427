-- configure_history(partition_interval, premake, retention, retention_action, rotate_every):
-- change how queue.history is partitioned and kept; arguments left NULL keep their value.
-- Accepted: partition_interval 1, 2, 3, 4, 6, 8 or 12 hours, 1 day or 7 days (UTC periods that
-- tile a day or a week, so every partition starts on a period boundary); premake 1 to 1000;
-- retention from partition_interval to 1000 years (a later bound overflows the timestamps rotation
-- computes); retention_action 'drop' or 'detach'; rotate_every above zero and below
-- partition_interval * premake (rotation must outrun the premade partitions). Anything else raises
-- 22023 and changes nothing.
-- Nothing moves at once: the next rotation applies the policy (a new interval to periods not yet
-- covered, a new retention to what it drops). Returns the policy row as stored.
-- Locks and writes the one row of queue.history_policy.
CREATE OR REPLACE FUNCTION queue.configure_history(
        partition_interval interval DEFAULT NULL,
        premake            integer  DEFAULT NULL,
        retention          interval DEFAULT NULL,
        retention_action   text     DEFAULT NULL,
        rotate_every       interval DEFAULT NULL)
    RETURNS queue.history_policy
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row queue.history_policy;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    -- Tests the table cannot make: interval equality counts a month as 30 days, so
    -- '1 mon -29 days' equals '1 day' and passes its list, and date_bin() refuses months.
    v_bad := CASE WHEN configure_history.retention > interval '1000 years'
                       OR pg_catalog.date_part('month', configure_history.partition_interval) <> 0
                       OR pg_catalog.date_part('year', configure_history.partition_interval) <> 0
                  THEN 'partition_interval, retention' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('configure_history', v_bad, pg_catalog.jsonb_build_object(
            'partition_interval', configure_history.partition_interval::text,
            'retention', configure_history.retention::text));
    END IF;
    -- </arguments>
    BEGIN
        UPDATE queue.history_policy AS p
           SET partition_interval = coalesce(configure_history.partition_interval, p.partition_interval),
               premake = coalesce(configure_history.premake, p.premake),
               retention = coalesce(configure_history.retention, p.retention),
               retention_action = coalesce(configure_history.retention_action, p.retention_action),
               rotate_every = coalesce(configure_history.rotate_every, p.rotate_every),
               updated = pg_catalog.now()
         WHERE p.one
        RETURNING p.* INTO STRICT v_row;
    EXCEPTION WHEN check_violation THEN
        PERFORM queue._raise_bad_argument('configure_history', 'settings', pg_catalog.jsonb_build_object('settings', SQLERRM));
    END;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION queue.configure_history(interval, integer, interval, text, interval) IS 'Sets the history policy (NULL keeps a value): partition_interval, premake, retention, retention_action, rotate_every. Raises 22023 for an invalid value. Applied by the next rotation. Writes queue.history_policy.';
REVOKE ALL ON FUNCTION queue.configure_history(interval, integer, interval, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.configure_history(interval, integer, interval, text, interval) TO skiplock_admin;
