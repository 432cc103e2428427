-- compact(): give the hot table's space back after bloat. Once a snapshot held open (an idle
-- transaction, a long report, a lagging slot) is gone, vacuum makes the dead versions reusable but
-- the files keep their peak size. compact() copies the live rows out, TRUNCATEs queue.live_tasks
-- (new, empty files for the heap and every index) and writes the rows back with their ids, leases
-- and states unchanged, in one transaction. Returns (tasks, bytes_before, bytes_after).
-- Locks: ACCESS EXCLUSIVE on queue.live_tasks until the caller's transaction ends (takes and
-- finishes wait meanwhile); it waits at most lock_timeout (100 ms) for it, else raises 55P03.
-- Like any TRUNCATE it is not MVCC-safe: an older REPEATABLE READ or SERIALIZABLE snapshot sees an
-- empty hot table afterwards. Raises 0A000 unless READ COMMITTED: its copy must be read with a
-- fresh snapshot, after the lock. maintain() calls it only when the table is mostly free space.
CREATE OR REPLACE FUNCTION queue.compact()
    RETURNS TABLE (tasks bigint, bytes_before bigint, bytes_after bigint)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '100ms'
AS $$
DECLARE
    v_rows queue.live_tasks[];
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'compact() must run in a READ COMMITTED transaction'
            USING ERRCODE = '0A000',
                  DETAIL = pg_catalog.format('This transaction is %s: its snapshot may predate tasks enqueued, taken or finished since, which the rewrite would lose or bring back.',
                                             pg_catalog.upper(pg_catalog.current_setting('transaction_isolation'))),
                  HINT = 'Call it on its own, or BEGIN ISOLATION LEVEL READ COMMITTED first. Nothing was changed.';
    END IF;
    bytes_before := pg_catalog.pg_total_relation_size('queue.live_tasks');
    BEGIN
        LOCK TABLE queue.live_tasks IN ACCESS EXCLUSIVE MODE;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'queue.live_tasks is busy: compact() did not get its lock within %',
                        pg_catalog.current_setting('lock_timeout')
            USING ERRCODE = '55P03',
                  DETAIL = 'A transaction holds a lock on queue.live_tasks (a long transaction that read it, a VACUUM or ANALYZE, or DDL).',
                  HINT = 'Nothing was changed. Try again later; pg_locks shows who holds it.';
    END;
    SELECT pg_catalog.array_agg(t ORDER BY t.id) INTO v_rows FROM queue.live_tasks t;
    TRUNCATE queue.live_tasks;
    INSERT INTO queue.live_tasks OVERRIDING SYSTEM VALUE
    SELECT * FROM pg_catalog.unnest(v_rows);
    tasks := coalesce(pg_catalog.cardinality(v_rows), 0)::bigint;
    bytes_after := pg_catalog.pg_total_relation_size('queue.live_tasks');
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION queue.compact() IS 'Gives queue.live_tasks'' space back after bloat: copies the live tasks out, TRUNCATEs the table, writes them back unchanged. ACCESS EXCLUSIVE on it until commit (waits 100 ms, else 55P03). Not MVCC-safe, like TRUNCATE; 0A000 unless READ COMMITTED.';
REVOKE ALL ON FUNCTION queue.compact() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.compact() TO skiplock_admin;
