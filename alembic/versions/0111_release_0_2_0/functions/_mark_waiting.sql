-- _mark_waiting(stage): a take found nothing due, so its caller is about to wait on the
-- stage's channel: make enqueues NOTIFY for the next minute, unless the stage's notify is off.
-- Writes at most about once per 30 s per stage (idle workers polling every second read, not write).
-- Never waits: the caller may be take_next, which promises not to, and the row may be held by
-- a take_locked worker whose transaction runs on (another stage's task, say). A row that another
-- transaction is writing is that one's mark; a concurrent first insert is waited on for at most
-- lock_timeout (10 ms), then left to its writer.
CREATE OR REPLACE FUNCTION queue._mark_waiting(stage text)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '10ms'
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queue.stage_waiters w
                WHERE w.stage = _mark_waiting.stage AND w.until > pg_catalog.now() + interval '30 seconds') THEN
        RETURN;
    END IF;
    -- A stage that does not notify needs no mark: its enqueues would call _wake_waiters for nothing.
    IF NOT (queue._settings(_mark_waiting.stage)).notify THEN
        RETURN;
    END IF;
    BEGIN
        PERFORM 1 FROM queue.stage_waiters w WHERE w.stage = _mark_waiting.stage FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            UPDATE queue.stage_waiters w
               SET until = pg_catalog.now() + interval '1 minute'
             WHERE w.stage = _mark_waiting.stage
               AND w.until < pg_catalog.now() + interval '1 minute';
        ELSIF NOT EXISTS (SELECT 1 FROM queue.stage_waiters w WHERE w.stage = _mark_waiting.stage) THEN
            INSERT INTO queue.stage_waiters AS w (stage, until)
            VALUES (_mark_waiting.stage, pg_catalog.now() + interval '1 minute')
            ON CONFLICT ON CONSTRAINT stage_waiters_pkey DO NOTHING;
        END IF;
    EXCEPTION WHEN serialization_failure OR lock_not_available THEN
        NULL;  -- a REPEATABLE READ caller raced another refresh, or a first insert is in flight: that one counts
    END;
END
$$;
COMMENT ON FUNCTION queue._mark_waiting(text) IS 'Internal, for take_next, take_locked and run_sql_tasks: records that a worker waits on the stage, so that enqueues NOTIFY skiplock.<stage> for the next minute. Writes queue.stage_waiters about once per 30 s per stage; never waits on a held row.';
REVOKE ALL ON FUNCTION queue._mark_waiting(text) FROM PUBLIC;
