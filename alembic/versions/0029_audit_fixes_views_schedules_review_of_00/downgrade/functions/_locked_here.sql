-- _locked_here(xmax): whether a row whose xmax this is carries a row lock of this transaction
-- itself (its top level, as take_locked locks): xmax is the transaction's id, or a multixact among
-- whose members the transaction holds FOR UPDATE. PostgreSQL writes such a multixact when a
-- savepoint updates or deletes a row the transaction had locked and is rolled back: the lock stays
-- the transaction's, but xmax no longer says so by itself. Runs only off the hot path.
CREATE OR REPLACE FUNCTION queue._locked_here(xmax xid)
    RETURNS boolean
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_top xid := pg_catalog.xid(pg_catalog.pg_current_xact_id_if_assigned());
BEGIN
    IF v_top IS NULL OR _locked_here.xmax IS NULL OR _locked_here.xmax = '0'::xid THEN
        RETURN false;
    END IF;
    IF _locked_here.xmax = v_top THEN
        RETURN true;
    END IF;
    BEGIN
        RETURN EXISTS (SELECT 1
                         FROM pg_catalog.pg_get_multixact_members(_locked_here.xmax) m
                        WHERE m.xid = v_top AND m.mode = 'forupd');
    EXCEPTION WHEN OTHERS THEN
        RETURN false;  -- a plain transaction id, which no multixact of that number exists for
    END;
END
$$;
COMMENT ON FUNCTION queue._locked_here(xid) IS 'Internal: whether a row with this xmax is locked FOR UPDATE by the calling transaction''s top level: xmax is its id, or a multixact holding its lock (left by a rolled-back savepoint that wrote the locked row). Used by take_locked''s later takes and by finish_locked and fail_locked.';
REVOKE ALL ON FUNCTION queue._locked_here(xid) FROM PUBLIC;
