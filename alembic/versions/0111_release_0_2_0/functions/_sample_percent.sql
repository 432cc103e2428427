-- _sample_percent(caller, sample_pages): the percentage of queue.live_tasks' pages that a block
-- sample of about sample_pages pages reads (TABLESAMPLE SYSTEM), 100 when the table has no more
-- pages than that (every row: exact). On Citus the coordinator's own table is empty (the rows are
-- in the shards): 100. For live_counts and recent_errors; caller names the function in the error.
-- Reads the table's size only. Raises 22023 for sample_pages NULL or below 1.
CREATE OR REPLACE FUNCTION queue._sample_percent(caller text, sample_pages integer)
    RETURNS double precision
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bad text;  -- the first bad argument's name
BEGIN
    v_bad := CASE WHEN _sample_percent.sample_pages IS NULL OR _sample_percent.sample_pages < 1 THEN 'sample_pages' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument(_sample_percent.caller, v_bad,
                                          pg_catalog.jsonb_build_object('sample_pages', _sample_percent.sample_pages::text));
    END IF;
    RETURN LEAST(100, 100 * _sample_percent.sample_pages::double precision
                      / GREATEST(pg_catalog.pg_relation_size('queue.live_tasks'::regclass)
                                 / pg_catalog.current_setting('block_size')::bigint, 1));
END
$$;
COMMENT ON FUNCTION queue._sample_percent(text, integer) IS 'Internal: the percentage of queue.live_tasks a block sample of about sample_pages pages reads (100: the whole table), for live_counts and recent_errors.';
REVOKE ALL ON FUNCTION queue._sample_percent(text, integer) FROM PUBLIC;
