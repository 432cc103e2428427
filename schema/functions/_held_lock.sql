-- _held_lock(id, action, stage): for finish_locked and fail_locked, once the fast check (xmax is this
-- transaction's id) failed: true when the task's row is still locked by this transaction's top
-- level through a multixact (a savepoint that wrote the row was rolled back). _locked_here's
-- answer is confirmed by asking for the weakest row lock without waiting: a lock already held
-- leaves xmax as it was; a new one changes it, and is undone (the row was nobody's, and a
-- multixact of this transaction merely had its number). Raises 55000 when the lock belongs to a
-- savepoint (take_locked called inside one). False in every other case.
-- stage, when given, is the caller's: only a task of that stage is looked at.
CREATE OR REPLACE FUNCTION queue._held_lock(id bigint, action text, stage text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_xmax xid;
BEGIN
    SELECT t.xmax INTO v_xmax
      FROM queue.live_tasks t
     WHERE t.id = _held_lock.id AND t.status IN ('ready', 'error')
       AND (_held_lock.stage IS NULL OR t.stage = _held_lock.stage);
    IF NOT FOUND OR v_xmax = '0'::xid
       OR v_xmax = pg_catalog.xid(pg_catalog.pg_current_xact_id_if_assigned()) THEN
        RETURN false;  -- gone, unlocked, or locked here and already ended here
    END IF;
    IF queue._locked_here(v_xmax) THEN
        BEGIN
            PERFORM FROM queue.live_tasks t
              WHERE t.id = _held_lock.id AND (_held_lock.stage IS NULL OR t.stage = _held_lock.stage)
                FOR KEY SHARE NOWAIT;
            IF (SELECT t.xmax FROM queue.live_tasks t
                 WHERE t.id = _held_lock.id AND (_held_lock.stage IS NULL OR t.stage = _held_lock.stage))
               IS DISTINCT FROM v_xmax THEN
                -- caught below: rolling back this block undoes the lock just taken
                RAISE EXCEPTION 'row lock of task % was not held', _held_lock.id
                    USING ERRCODE = '55P03',
                          DETAIL = 'Asking for it changed xmax: the row was nobody''s.',
                          HINT = 'Internal: caught by _held_lock, which answers false.';
            END IF;
            RETURN true;
        EXCEPTION WHEN lock_not_available THEN
            RETURN false;
        END;
    END IF;
    PERFORM queue._raise_savepoint_lock(_held_lock.id, _held_lock.action, _held_lock.stage);
    RETURN false;
END
$$;
COMMENT ON FUNCTION queue._held_lock(bigint, text, text) IS 'Internal, for finish_locked and fail_locked: true when the task''s row lock is still this transaction''s through a multixact (a rolled-back savepoint wrote the row), confirmed by FOR KEY SHARE NOWAIT; 55000 when a savepoint holds it.';
REVOKE ALL ON FUNCTION queue._held_lock(bigint, text, text) FROM PUBLIC;
