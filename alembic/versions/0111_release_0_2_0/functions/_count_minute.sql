-- _count_minute(): the minute queue.finished_counts counts runs that end now in: the
-- transaction's start (now(), as history's finished of most ends), binned from a fixed origin in
-- UTC (date_bin: the same minutes in every time zone of whole minutes).
CREATE OR REPLACE FUNCTION queue._count_minute()
    RETURNS timestamptz
    LANGUAGE sql
    STABLE
    PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.date_bin(interval '1 minute', pg_catalog.now(), timestamptz '2000-01-01 00:00+00')
$$;
COMMENT ON FUNCTION queue._count_minute() IS 'Internal: the minute of queue.finished_counts for runs that end in this transaction.';
REVOKE ALL ON FUNCTION queue._count_minute() FROM PUBLIC;
