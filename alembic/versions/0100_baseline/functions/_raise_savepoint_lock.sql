-- _raise_savepoint_lock(id, action, stage): the error for finish_locked or fail_locked of a task whose
-- row lock belongs to a savepoint of this transaction rather than to the transaction itself: a
-- subtransaction locks with its own id, which is not the one those functions look for. Returns
-- quietly in every other case (the task is gone, unlocked, or another transaction's): then the
-- caller's answer false is the right one. Runs only on that path, never on a successful end.
-- stage, when given, is the caller's: only a task of that stage is looked at.
CREATE OR REPLACE FUNCTION queue._raise_savepoint_lock(id bigint, action text, stage text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_xmax xid;
    v_top  bigint := pg_catalog.pg_current_xact_id()::text::bigint;
    v_full bigint;
BEGIN
    SELECT t.xmax INTO v_xmax
      FROM queue.live_tasks t
     WHERE t.id = _raise_savepoint_lock.id AND t.status IN ('ready', 'error')
       AND (_raise_savepoint_lock.stage IS NULL OR t.stage = _raise_savepoint_lock.stage);
    IF NOT FOUND OR v_xmax = '0'::xid OR v_xmax = pg_catalog.xid(v_top::text::xid8) THEN
        RETURN;
    END IF;
    -- xmax is 32 bits: give it the epoch that puts it nearest this transaction's id (a
    -- subtransaction's id comes after it, possibly across an epoch boundary).
    v_full := (v_top & ~4294967295::bigint) | v_xmax::text::bigint;
    IF v_full > v_top + 2147483648 THEN
        v_full := v_full - 4294967296;
    ELSIF v_full < v_top - 2147483648 THEN
        v_full := v_full + 4294967296;
    END IF;
    BEGIN
        -- In progress and yet lockable without waiting: the lock is this transaction's own.
        IF v_full < 0 OR pg_catalog.pg_xact_status(v_full::text::xid8) IS DISTINCT FROM 'in progress' THEN
            RETURN;
        END IF;
        PERFORM FROM queue.live_tasks t
          WHERE t.id = _raise_savepoint_lock.id
            AND (_raise_savepoint_lock.stage IS NULL OR t.stage = _raise_savepoint_lock.stage)
            FOR UPDATE NOWAIT;
    EXCEPTION WHEN lock_not_available OR invalid_parameter_value THEN
        RETURN;  -- another transaction's lock, or an xmax that is no transaction id (a multixact)
    END;
    RAISE EXCEPTION 'cannot % task %: it was taken inside a savepoint', _raise_savepoint_lock.action, _raise_savepoint_lock.id
        USING ERRCODE = '55000',
              DETAIL = 'Its row lock belongs to a subtransaction; finish_locked and fail_locked end only tasks locked by the transaction itself.',
              HINT = 'Call take_locked at the top level of the transaction, not inside a savepoint or a nested transaction block; savepoints around the work itself are fine.';
END
$$;
COMMENT ON FUNCTION queue._raise_savepoint_lock(bigint, text, text) IS 'Internal: raises 55000 when a task''s row lock belongs to a savepoint of this transaction (take_locked called inside a savepoint); returns otherwise. Called by finish_locked and fail_locked before they answer false.';
REVOKE ALL ON FUNCTION queue._raise_savepoint_lock(bigint, text, text) FROM PUBLIC;
