-- maintain_now(): maintain() as of now by whichever worker calls first: what `skiplock worker` and the
-- clients call every few seconds, so that expired leases come back and cron ticks fire with no
-- `skiplock maintain` or pg_cron beside them. One session at a time: a call that does not get the
-- transaction-level advisory lock 'skiplock.worker_maintain' returns no row at once. Unlike
-- maintain(now) it takes no `now`, so a worker login cannot move rotation or reaping in time.
-- Returns maintain()'s rows (task, count, detail), or none. Locks and writes what maintain() does;
-- call it in a transaction of its own (compaction's lock lasts until commit).
CREATE OR REPLACE FUNCTION queue.maintain_now()
    RETURNS TABLE (task text, count integer, detail text)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended('skiplock.worker_maintain', 0)) THEN
        RETURN QUERY SELECT m.task, m.count, m.detail FROM queue.maintain(pg_catalog.now()) m;
    END IF;
END
$$;
COMMENT ON FUNCTION queue.maintain_now() IS 'maintain() as of now, for workers that maintain the queue themselves: one session at a time (a transaction advisory lock), no row when another runs it. Granted to skiplock_worker.';
REVOKE ALL ON FUNCTION queue.maintain_now() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.maintain_now() TO skiplock_worker, skiplock_admin;
