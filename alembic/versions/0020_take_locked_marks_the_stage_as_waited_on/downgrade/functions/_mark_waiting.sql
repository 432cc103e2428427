-- _mark_waiting(stage): take_next found nothing due, so its caller is about to wait on the
-- stage's channel: make enqueues NOTIFY for the next minute. Writes at most about once per 30 s
-- per stage (idle workers polling every second read, not write); a refresh that would wait for
-- or conflict with a concurrent one is left to that one.
CREATE OR REPLACE FUNCTION queue._mark_waiting(stage text)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queue.stage_waiters w
                WHERE w.stage = _mark_waiting.stage AND w.until > pg_catalog.now() + interval '30 seconds') THEN
        RETURN;
    END IF;
    BEGIN
        INSERT INTO queue.stage_waiters AS w (stage, until)
        VALUES (_mark_waiting.stage, pg_catalog.now() + interval '1 minute')
        ON CONFLICT ON CONSTRAINT stage_waiters_pkey DO UPDATE
           SET until = excluded.until
         WHERE w.until < excluded.until;
    EXCEPTION WHEN serialization_failure OR lock_not_available THEN
        NULL;  -- a REPEATABLE READ caller raced another refresh: that one counts
    END;
END
$$;
COMMENT ON FUNCTION queue._mark_waiting(text) IS 'Internal, for take_next: records that a worker waits on the stage, so that enqueues send NOTIFY skiplock.<stage> for the next minute. Writes queue.stage_waiters at most about every 30 s per stage.';
REVOKE ALL ON FUNCTION queue._mark_waiting(text) FROM PUBLIC;
