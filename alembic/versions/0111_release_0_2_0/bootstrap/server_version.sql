-- Runs first: a server older than skiplock supports is refused in one line, before any object is
-- created (the functions use multiranges, range_agg and date_bin, which PostgreSQL 14 added).
DO $server_version$
BEGIN
    IF pg_catalog.current_setting('server_version_num'::pg_catalog.text)::pg_catalog.int4 OPERATOR(pg_catalog.<) 140000 THEN
        RAISE EXCEPTION 'skiplock needs PostgreSQL 14 or later; this server is %',
                        pg_catalog.current_setting('server_version'::pg_catalog.text)
            USING ERRCODE = '0A000',
                  DETAIL = 'skiplock is tested on PostgreSQL 14, 15, 16, 17 and 18.',
                  HINT = 'Upgrade the server (pg_upgrade), then run skiplock upgrade again.';
    END IF;
END
$server_version$;
