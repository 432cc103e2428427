-- compact(): give the hot table's space back. A snapshot held open (an idle transaction, a long
-- report, a lagging replica slot) keeps every task processed meanwhile as dead row versions; once it
-- ends, vacuum makes the space reusable but PostgreSQL keeps the files at their peak size, so the
-- claim index and the heap stay several times the backlog's size. compact() copies the live rows
-- out, TRUNCATEs queue.live_tasks (new, empty files for the heap and every index) and writes the
-- rows back with their ids, leases and states unchanged, in one transaction.
-- Locks: ACCESS EXCLUSIVE on queue.live_tasks until the caller's transaction ends; takes and
-- finishes wait meanwhile (about 0.3 s for a 30,000-task backlog on 2 cores). It waits at most
-- lock_timeout (100 ms) for the lock and raises 55P03 when a transaction holds the table.
-- Like any TRUNCATE it is not MVCC-safe: a REPEATABLE READ or SERIALIZABLE transaction whose
-- snapshot is older sees an empty hot table afterwards. READ COMMITTED work (every queue function
-- called on its own) is unaffected. maintain() calls it only when the table is mostly empty space.
-- It must itself run READ COMMITTED (0A000 otherwise): its copy of the rows is read after the
-- lock, with a fresh snapshot; an older one would write back a stale table, losing the tasks
-- enqueued since and bringing finished ones back.
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
COMMENT ON FUNCTION queue.compact() IS 'Gives queue.live_tasks'' space back after bloat (a long transaction held vacuum back): copies the live tasks out, TRUNCATEs the table and its indexes, writes them back unchanged. Takes ACCESS EXCLUSIVE on queue.live_tasks until the transaction ends (waits at most 100 ms for it, else 55P03, nothing changed). Not MVCC-safe, like TRUNCATE: older REPEATABLE READ snapshots see the hot table empty. Returns (tasks, bytes_before, bytes_after). Raises 0A000 outside READ COMMITTED. maintain() calls it when the table is mostly free space.';
REVOKE ALL ON FUNCTION queue.compact() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.compact() TO skiplock_admin;
