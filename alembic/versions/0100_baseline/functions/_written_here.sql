-- _written_here(xmin): whether a row version was written by this transaction or one of its
-- savepoints. A version whose writer is still in progress is visible only to that writer, so a
-- visible version with an xmin in progress is ours, whichever subtransaction wrote it.
-- finish_locked and fail_locked call it only for versions stamped after the transaction began.
CREATE OR REPLACE FUNCTION queue._written_here(xmin xid)
    RETURNS boolean
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_top  bigint := pg_catalog.pg_current_xact_id_if_assigned()::text::bigint;
    v_full bigint;
BEGIN
    IF v_top IS NULL OR _written_here.xmin IS NULL THEN
        RETURN false;  -- this transaction has written nothing
    END IF;
    -- xmin is 32 bits: give it the epoch that puts it nearest this transaction's id.
    v_full := (v_top & ~4294967295::bigint) | _written_here.xmin::text::bigint;
    IF v_full > v_top + 2147483648 THEN
        v_full := v_full - 4294967296;
    ELSIF v_full < v_top - 2147483648 THEN
        v_full := v_full + 4294967296;
    END IF;
    RETURN v_full >= 0 AND pg_catalog.pg_xact_status(v_full::text::xid8) IS NOT DISTINCT FROM 'in progress';
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN false;  -- not a transaction id pg_xact_status can read
END
$$;
COMMENT ON FUNCTION queue._written_here(xid) IS 'Internal: whether a visible row version with this xmin was written by the calling transaction or one of its savepoints (its writer is in progress). finish_locked and fail_locked use it to tell a task they already ended from the version they took.';
REVOKE ALL ON FUNCTION queue._written_here(xid) FROM PUBLIC;
