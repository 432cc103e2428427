-- _compaction_due(): whether maintain() should compact() queue.live_tasks now, and why (not).
-- Due when all hold: the table with its indexes is over 8 MB; it is over 4 times what its live
-- tasks need (their width from pg_stats, 150 bytes if never analyzed, plus about 100 bytes of
-- tuple header and index entries each); at most 50,000 live tasks (compact() holds its lock while
-- it copies them); this session's last try did not fail on the lock in the past 60 s; and no other
-- session of this database holds a snapshot that compact() would cut under it: one idle in a
-- transaction with a backend_xmin, or holding one for over a second (another role's session, whose
-- state shows only to pg_read_all_stats, when its backend_xmin is older than this call's).
-- Reads statistics and pg_stat_activity only: no lock on the table, no scan. Raises nothing.
CREATE OR REPLACE FUNCTION queue._compaction_due(OUT due boolean, OUT detail text)
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bytes bigint := pg_catalog.pg_total_relation_size('queue.live_tasks');
    v_live  bigint := pg_catalog.pg_stat_get_live_tuples('queue.live_tasks'::regclass);
    v_age   integer := pg_catalog.age(pg_catalog.xid(pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())));
    v_holder text;
    v_row   bigint;
    v_need  numeric;
    v_retry text := pg_catalog.current_setting('skiplock.compact_retry_at', true);
BEGIN
    SELECT coalesce(pg_catalog.sum(s.avg_width), 150) + 100 INTO v_row
      FROM pg_catalog.pg_stats s
     WHERE s.schemaname = 'queue' AND s.tablename = 'live_tasks';
    v_need := v_live::numeric * v_row;
    due := false;
    IF v_bytes <= 8 * 1024 * 1024 OR v_bytes <= 4 * v_need THEN
        detail := pg_catalog.format('not needed: %s for about %s live tasks', pg_catalog.pg_size_pretty(v_bytes), v_live);
    ELSIF v_live > 50000 THEN
        detail := pg_catalog.format('not automatic: %s for about %s live tasks (over 50,000); run queue.compact() by hand',
                                    pg_catalog.pg_size_pretty(v_bytes), v_live);
    ELSIF v_retry IS NOT NULL AND v_retry <> ''
          AND v_retry::double precision > pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) THEN
        detail := 'due, but the table was busy at the last try; this session tries again within 60 s';
    ELSE
        -- TRUNCATE is not MVCC-safe: a snapshot taken before compact() commits sees the table empty.
        -- backend_xmin is shown to every role; state and xact_start only to the session's own role
        -- and to members of pg_read_all_stats (backend_type is then NULL too).
        SELECT CASE WHEN a.backend_type IS NULL
                    THEN pg_catalog.format('pid %s (another role''s session) holds a snapshot older than this call''s', a.pid)
                    ELSE pg_catalog.format('pid %s (%s) has held a snapshot for %s', a.pid, a.state,
                                           pg_catalog.date_trunc('second', pg_catalog.clock_timestamp() - a.xact_start))
               END
          INTO v_holder
          FROM pg_catalog.pg_stat_activity a
         WHERE a.datname = pg_catalog.current_database()
           AND a.pid <> pg_catalog.pg_backend_pid()
           AND a.backend_xmin IS NOT NULL
           AND CASE WHEN a.backend_type IS NULL
                    THEN pg_catalog.age(a.backend_xmin) > v_age
                    ELSE a.backend_type = 'client backend'
                         AND (a.state LIKE 'idle in transaction%'
                              OR a.xact_start < pg_catalog.clock_timestamp() - interval '1 second')
               END
         ORDER BY pg_catalog.age(a.backend_xmin) DESC
         LIMIT 1;
    END IF;
    IF v_holder IS NOT NULL THEN
        detail := pg_catalog.format('waiting for a snapshot: %s; compacting now would hide every task from it',
                                    v_holder);
    ELSIF detail IS NULL THEN
        due := true;
        detail := pg_catalog.format('due: %s for about %s live tasks', pg_catalog.pg_size_pretty(v_bytes), v_live);
    END IF;
END
$$;
COMMENT ON FUNCTION queue._compaction_due() IS 'Internal: whether maintain() should compact queue.live_tasks now, and why: over 8 MB and 4 times what its live tasks need, at most 50,000 live tasks, no failed try in this session in 60 s, no other session holding a snapshot.';
REVOKE ALL ON FUNCTION queue._compaction_due() FROM PUBLIC;
