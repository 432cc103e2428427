-- _sql_record(id, lease, result, error, give_back): run_sql_tasks' last step for one task, in the
-- request's own transaction (its effects and its record commit together).
--   result     (error NULL) the run succeeded: finish(); the history row gets the result, or is
--              removed when the task was enqueued with keep_history => false.
--   error      the run failed: fail(); the stage's backoff and max_attempts decide.
--   give_back  the executor is stopping: release(), the attempt is not counted.
-- The run's history row is stamped with its real end (clock_timestamp()), and a periodic task's
-- next run is planned from it.
-- Returns false when the lease is no longer current (the task was reaped or cancelled).
-- Locks the task's row; writes queue.live_tasks and queue.history.
CREATE OR REPLACE FUNCTION queue._sql_record(
        id        bigint,
        lease     uuid,
        result    jsonb,
        error     text    DEFAULT NULL,
        give_back boolean DEFAULT false)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_task queue.live_tasks;
    v_end  timestamptz := pg_catalog.clock_timestamp();
    v_keep boolean;
    v_done boolean;
BEGIN
    IF _sql_record.give_back THEN
        RETURN queue.release(_sql_record.id, _sql_record.lease);
    END IF;
    SELECT t.* INTO v_task
      FROM queue.live_tasks t
     WHERE t.id = _sql_record.id AND t.lease = _sql_record.lease AND t.run_as IS NOT NULL
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF _sql_record.error IS NOT NULL THEN
        v_done := queue.fail(_sql_record.id, _sql_record.lease, _sql_record.error);
    ELSE
        v_done := queue.finish(_sql_record.id, _sql_record.lease);
    END IF;
    IF NOT v_done THEN
        RETURN false;  -- nothing ended here: no history row of this run to stamp
    END IF;
    v_keep := coalesce((v_task.payload ->> 'keep_history')::boolean, true);
    IF v_keep OR _sql_record.error IS NOT NULL THEN
        -- The row finish() or a fatal fail() wrote in this transaction (finished = now()).
        UPDATE queue.history h
           SET finished = v_end,
               result   = CASE WHEN _sql_record.error IS NULL THEN _sql_record.result END
         WHERE h.id = _sql_record.id AND h.finished = pg_catalog.now();
    ELSE
        DELETE FROM queue.history h
         WHERE h.id = _sql_record.id AND h.finished = pg_catalog.now() AND h.status = 'done';
    END IF;
    IF v_task.repeat IS NOT NULL THEN
        -- Re-armed by finish()/fail() from now(); plan from the run's real end.
        UPDATE queue.live_tasks t
           SET run_at = queue._next_slot(v_task.slot, v_task.repeat, v_task.drift, v_end),
               slot   = queue._next_slot(v_task.slot, v_task.repeat, v_task.drift, v_end)
         WHERE t.id = _sql_record.id AND t.status = 'ready' AND t.slot IS DISTINCT FROM v_task.slot;
    END IF;
    RETURN v_done;
END
$$;
COMMENT ON FUNCTION queue._sql_record(bigint, uuid, jsonb, text, boolean) IS 'Internal, for run_sql_tasks: ends an SQL task''s attempt as done with its result, failed with its error (retry or fatal by the stage''s policy), or released (executor stopping), stamped with the run''s real end. False when the lease is not current.';
REVOKE ALL ON FUNCTION queue._sql_record(bigint, uuid, jsonb, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._sql_record(bigint, uuid, jsonb, text, boolean) TO skiplock_sql;
