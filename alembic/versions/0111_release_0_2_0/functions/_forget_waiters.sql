-- _forget_waiters(): delete the marks of queue.stage_waiters that no longer wake anyone (their
-- `until` has passed, or a wake-up ended them), so the table holds only the stages a worker found
-- empty within the last minute, however many stage names workers ever waited on. A worker still
-- waiting marks its stage again at its next empty poll. Returns how many it deleted, at most
-- 10,000 a call. SKIP LOCKED: never waits on a mark that a take is writing. On Citus, where a
-- statement that locks rows stays on one shard, it runs once per stage (1,000 stages a call).
-- Locks and deletes rows of queue.stage_waiters; raises nothing of its own.
CREATE OR REPLACE FUNCTION queue._forget_waiters()
    RETURNS integer
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now    timestamptz := pg_catalog.now();
    v_stages text[] := ARRAY[NULL]::text[];  -- NULL: no stage filter (one server)
    v_of     text;
    v_part   integer;
    v_count  integer := 0;
BEGIN
    IF pg_catalog.current_setting('citus.version', true) IS NOT NULL THEN
        v_stages := ARRAY(SELECT w.stage FROM queue.stage_waiters w WHERE w.until < v_now LIMIT 1000);
    END IF;
    FOREACH v_of IN ARRAY v_stages LOOP
        DELETE FROM queue.stage_waiters w
         WHERE w.stage IN (SELECT x.stage FROM queue.stage_waiters x
                            WHERE x.until < v_now AND (v_of IS NULL OR x.stage = v_of)
                            LIMIT 10000
                              FOR UPDATE SKIP LOCKED)
           AND (v_of IS NULL OR w.stage = v_of);
        GET DIAGNOSTICS v_part = ROW_COUNT;
        v_count := v_count + v_part;
    END LOOP;
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION queue._forget_waiters() IS 'Internal, for maintain(): deletes the marks of queue.stage_waiters that no longer wake anyone (until passed), at most 10,000 a call, skipping rows being written. Returns the count.';
REVOKE ALL ON FUNCTION queue._forget_waiters() FROM PUBLIC;
