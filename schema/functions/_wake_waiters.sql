-- _wake_waiters(stage): a task of the stage became due at once by some other way than an enqueue
-- (a release, a retry, a failure retried at once, a re-run queued again, a reaped task): wake
-- the workers that wait on the stage's channel, as enqueue does. Sends NOTIFY only while a
-- worker waits (queue.stage_waiters) and the stage has not turned it off; workers poll anyway, so
-- this only shortens their wait.
CREATE OR REPLACE FUNCTION queue._wake_waiters(stage text)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Two tests, not one expression: Citus runs a query on stage_waiters on its shard, where a
    -- function that queries stage_settings may not run.
    IF EXISTS (SELECT 1 FROM queue.stage_waiters w
                WHERE w.stage = _wake_waiters.stage AND w.until > pg_catalog.now()) THEN
      IF (queue._settings(_wake_waiters.stage)).notify THEN
        -- One NOTIFY per wait: the first wake-up ends the mark, and the worker marks the stage
        -- again when a take next finds it empty. SKIP LOCKED: never wait on another writer of the
        -- mark; notify anyway then, so that its rollback cannot leave this task unannounced.
        BEGIN
            UPDATE queue.stage_waiters w
               SET until = '-infinity'
             WHERE w.stage = _wake_waiters.stage  -- the shard's key, for Citus
               AND w.stage = (SELECT l.stage FROM queue.stage_waiters l
                               WHERE l.stage = _wake_waiters.stage AND l.until > pg_catalog.now()
                                 FOR UPDATE SKIP LOCKED);
        EXCEPTION WHEN serialization_failure THEN
            NULL;  -- a REPEATABLE READ caller: another wake-up ended the mark since its snapshot
        END;
        PERFORM pg_catalog.pg_notify('skiplock.' || _wake_waiters.stage, '');
      END IF;
    END IF;
END
$$;
COMMENT ON FUNCTION queue._wake_waiters(text) IS 'Internal, for release, retry, fail, fail_locked, finish, finish_batch and reap_hung: when a task becomes due at once, sends NOTIFY skiplock.<stage> as enqueue does, only while a worker waits (stage_waiters) and the stage''s notify is on.';
REVOKE ALL ON FUNCTION queue._wake_waiters(text) FROM PUBLIC;
