-- _lock_holders(rel): who holds or waits for a lock on a relation, for the "skipped: busy" rows
-- of rotate_partitions(): a DBA reading them can look the sessions up in pg_stat_activity.
CREATE OR REPLACE FUNCTION queue._lock_holders(rel regclass)
    RETURNS text
    LANGUAGE sql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(pg_catalog.string_agg(pg_catalog.format('pid %s %s%s', l.pid, l.mode,
                                                            CASE WHEN l.granted THEN '' ELSE ' (waiting)' END),
                                          ', ' ORDER BY l.pid, l.mode),
                    'a session that has released it since')
      FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'relation'
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
       AND l.relation = $1
       AND l.pid <> pg_catalog.pg_backend_pid()
$$;
COMMENT ON FUNCTION queue._lock_holders(regclass) IS 'Internal: the sessions holding or awaiting a lock on a relation, as ''pid N Mode'' text, for rotate_partitions() to say why it skipped a partition.';
REVOKE ALL ON FUNCTION queue._lock_holders(regclass) FROM PUBLIC;
