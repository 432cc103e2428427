-- _sql_record(id, lease, result, error, give_back): run_sql_tasks' last step for one task.
--   result (error NULL)   the run succeeded: finish(); the history row gets the result, or is
--                         removed when the task was enqueued with keep_history => false.
--   error                 the run failed: fail(), so the stage's backoff and max_attempts decide
--                         between a retry and fatal.
--   give_back             the executor is stopping (its run was cancelled before the timeout):
--                         release(), the attempt is not counted.
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
    v_keep boolean;
BEGIN
    IF _sql_record.give_back THEN
        RETURN queue.release(_sql_record.id, _sql_record.lease);
    END IF;
    IF _sql_record.error IS NOT NULL THEN
        RETURN queue.fail(_sql_record.id, _sql_record.lease, _sql_record.error);
    END IF;
    SELECT coalesce((t.payload ->> 'keep_history')::boolean, true) INTO v_keep
      FROM queue.live_tasks t
     WHERE t.id = _sql_record.id AND t.lease = _sql_record.lease AND t.run_as IS NOT NULL;
    IF NOT FOUND OR NOT queue.finish(_sql_record.id, _sql_record.lease) THEN
        RETURN false;
    END IF;
    -- finish() wrote the run's row in this transaction, finished = now().
    IF v_keep THEN
        UPDATE queue.history h
           SET result = _sql_record.result
         WHERE h.id = _sql_record.id AND h.finished = pg_catalog.now() AND h.status = 'done';
    ELSE
        DELETE FROM queue.history h
         WHERE h.id = _sql_record.id AND h.finished = pg_catalog.now() AND h.status = 'done';
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION queue._sql_record(bigint, uuid, jsonb, text, boolean) IS 'Internal, for run_sql_tasks (role skiplock_sql_executor): ends an SQL task''s attempt: done with its result (no history row with keep_history => false), failed with an error (retry or fatal by the stage''s policy), or released (executor stopping). False when the lease is not current.';
REVOKE ALL ON FUNCTION queue._sql_record(bigint, uuid, jsonb, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._sql_record(bigint, uuid, jsonb, text, boolean) TO skiplock_sql_executor;
