-- _compaction_due(): whether maintain() should compact() queue.live_tasks now, and why (not).
-- Due when all hold: the table with its indexes is over 8 MB; it is over 4 times what its live
-- tasks need (their width from pg_stats, 150 bytes if never analyzed, plus about 100 bytes of
-- tuple header and index entries each); vacuum has caught up (dead versions fewer than live ones,
-- or a vacuum ended in the past 10 s and the dead versions are no more than the churn since, three
-- per task inserted); at most 50,000 live tasks (compact() holds its lock while it copies them);
-- and this session's last try did not fail on the lock in the past 60 s.
-- Reads statistics only: no lock on the table, no scan. Raises nothing.
CREATE OR REPLACE FUNCTION queue._compaction_due(OUT due boolean, OUT detail text)
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bytes bigint := pg_catalog.pg_total_relation_size('queue.live_tasks');
    v_live  bigint := pg_catalog.pg_stat_get_live_tuples('queue.live_tasks'::regclass);
    v_dead  bigint := pg_catalog.pg_stat_get_dead_tuples('queue.live_tasks'::regclass);
    v_inserted_since_vacuum bigint := pg_catalog.pg_stat_get_ins_since_vacuum('queue.live_tasks'::regclass);
    v_vacuumed timestamptz := GREATEST(pg_catalog.pg_stat_get_last_vacuum_time('queue.live_tasks'::regclass),
                                       pg_catalog.pg_stat_get_last_autovacuum_time('queue.live_tasks'::regclass));
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
    ELSIF v_dead >= GREATEST(v_live, 1000)
          AND NOT coalesce(v_vacuumed > pg_catalog.clock_timestamp() - interval '10 seconds'
                           AND v_dead < GREATEST(v_live, 1000) + 3 * v_inserted_since_vacuum, false) THEN
        detail := pg_catalog.format('waiting for vacuum: %s for about %s live tasks and %s dead row versions',
                                    pg_catalog.pg_size_pretty(v_bytes), v_live, v_dead);
    ELSIF v_live > 50000 THEN
        detail := pg_catalog.format('not automatic: %s for about %s live tasks (over 50,000); run queue.compact() by hand',
                                    pg_catalog.pg_size_pretty(v_bytes), v_live);
    ELSIF v_retry IS NOT NULL AND v_retry <> ''
          AND v_retry::double precision > pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) THEN
        detail := 'due, but the table was busy at the last try; this session tries again within 60 s';
    ELSE
        due := true;
        detail := pg_catalog.format('due: %s for about %s live tasks', pg_catalog.pg_size_pretty(v_bytes), v_live);
    END IF;
END
$$;
COMMENT ON FUNCTION queue._compaction_due() IS 'Internal: whether maintain() should compact queue.live_tasks now, and why: over 8 MB and 4 times what its live tasks need, vacuum caught up, at most 50,000 live tasks, no failed try in this session in the past 60 s. Reads statistics only.';
REVOKE ALL ON FUNCTION queue._compaction_due() FROM PUBLIC;
