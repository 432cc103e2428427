-- workers(): the workers holding leases now, per worker and stage: running tasks, the oldest
-- start, the first lease to expire and how many have expired (reap_hung will recover them).
-- Reads only the running rows, through the running index (queue.tasks' status, a text cast, can
-- use no index: a query on it reads every live task). Stages the caller was not granted
-- (_hidden_stages) are left out. Reads live_tasks; locks and writes nothing; raises nothing.
CREATE OR REPLACE FUNCTION queue.workers()
    RETURNS TABLE (worker text, stage text, running bigint, since timestamptz, lease_expires timestamptz,
                   expired bigint)
    LANGUAGE sql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- The running index, whatever the statistics say, and no parallel workers taking the workers'
    -- CPU.
    SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0
AS $$
    SELECT t.worker, t.stage, pg_catalog.count(*), pg_catalog.min(t.started), pg_catalog.min(t.lease_expires),
           pg_catalog.count(*) FILTER (WHERE t.lease_expires < pg_catalog.now())
      FROM queue.live_tasks t
     WHERE t.status = 'running'
       AND t.stage <> ALL ((SELECT queue._hidden_stages())::text[])  -- restricted stages the caller was not granted
     GROUP BY t.worker, t.stage
$$;
COMMENT ON FUNCTION queue.workers() IS 'The workers holding leases now, per worker and stage: running tasks, oldest start, first lease to expire, expired leases. Reads only the running tasks.';
REVOKE ALL ON FUNCTION queue.workers() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.workers() TO skiplock_monitor, skiplock_admin;
