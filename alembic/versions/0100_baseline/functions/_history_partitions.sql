-- _history_partitions(): the dated partitions of queue.history with the range each covers, read
-- from the catalog (the default partition is not listed). The bounds are read back from
-- pg_get_expr() under DateStyle ISO, whose numeric offsets read back exactly (a zone abbreviation,
-- as other styles print, may be read as another zone: IST as Israel's); MINVALUE and MAXVALUE
-- become -infinity and infinity.
CREATE OR REPLACE FUNCTION queue._history_partitions()
    RETURNS TABLE (partition regclass, schema text, name text, range tstzrange)
    LANGUAGE sql
    STABLE
    SET search_path = pg_catalog, pg_temp
    SET DateStyle = 'ISO, YMD'
AS $$
    SELECT c.oid::pg_catalog.regclass, n.nspname::text, c.relname::text,
           pg_catalog.tstzrange(
               CASE b.m[1] WHEN 'MINVALUE' THEN '-infinity'::timestamptz
                           ELSE pg_catalog.btrim(b.m[1], '''')::timestamptz END,
               CASE b.m[2] WHEN 'MAXVALUE' THEN 'infinity'::timestamptz
                           ELSE pg_catalog.btrim(b.m[2], '''')::timestamptz END)
      FROM pg_catalog.pg_inherits i
      JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     CROSS JOIN LATERAL (SELECT pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                                                        '^FOR VALUES FROM \((.+)\) TO \((.+)\)$') AS m) b
     WHERE i.inhparent = 'queue.history'::pg_catalog.regclass
       AND b.m IS NOT NULL
$$;
COMMENT ON FUNCTION queue._history_partitions() IS 'Internal: the dated partitions of queue.history (not the default) and the finish-time range each covers, for rotate_partitions().';
REVOKE ALL ON FUNCTION queue._history_partitions() FROM PUBLIC;
