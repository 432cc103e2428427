-- _locked_here(xmax): whether a row whose xmax this is may carry a row lock of this transaction
-- itself (its top level, as take_locked locks): xmax is the transaction's id, or a multixact
-- among whose members the transaction is. PostgreSQL writes such a multixact when a savepoint
-- updates or deletes a row the transaction had locked and is rolled back: the lock stays the
-- transaction's, but xmax no longer says so by itself. Any mode counts: a version this
-- transaction wrote carries its lock as a key-share lock. Multixacts and transaction ids are
-- numbered apart, so a plain xmax can name a multixact of this transaction by chance: a true
-- answer is only a candidate, which _held_lock confirms. take_locked calls it only in a
-- transaction's later takes, and only for an xmax that can be a multixact (mxid_age > 0).
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
                        WHERE m.xid = v_top);
    EXCEPTION WHEN OTHERS THEN
        RETURN false;  -- a plain transaction id, which no multixact of that number exists for
    END;
END
$$;
COMMENT ON FUNCTION queue._locked_here(xid) IS 'Internal: whether a row with this xmax may be locked by the calling transaction''s top level: xmax is its id, or a multixact it is a member of. A true answer is only a candidate, which _held_lock confirms. Used by take_locked and _held_lock.';
REVOKE ALL ON FUNCTION queue._locked_here(xid) FROM PUBLIC;
